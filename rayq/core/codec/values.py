"""Task values: the arguments and results rayq carries, as bytes, never through pickle.

A value that is plain msgpack (None, bool, int, float, str, bytes, and lists and dicts
of them) is packed as it always was, by one call of msgpack in C: the fast path of
every small task. Anything else goes as a *values body*:

``VALUES_TAG`` (1 byte) | header length (4 bytes, big-endian) | header | buffers

The header is msgpack in which each other type is an extension type of the table
below. Large payloads (an array's memory, an Arrow IPC stream) do not go inside the
header: they follow it, each starting at a multiple of ``ALIGN`` bytes from the body's
start, and their extension says where (offset from the first buffer, length). So an
array's bytes are copied once into the body, and read back in place:
``numpy.frombuffer`` over the received bytes, Arrow IPC from a ``pyarrow.py_buffer``
over them (arrays given back are therefore read-only).

=====  ==================  =========================================================
code   type                payload
=====  ==================  =========================================================
1      tuple               msgpack of its items (a tuple subclass comes back a tuple)
2      datetime.datetime   [year, month, day, hour, minute, second, µs, fold, tz]; tz
                           None, ["fixed", days, seconds, µs, name or None] (a
                           datetime.timezone) or ["zone", key] (a zoneinfo.ZoneInfo)
3      datetime.date       [year, month, day]
4      datetime.timedelta  [days, seconds, µs]
5      decimal.Decimal     its str (exact, NaN and infinities included)
6      uuid.UUID           its 16 bytes
16     numpy.ndarray       [dtype, shape, "C" or "F", offset, length]; dtype: its
                           ``dtype.str``, or for a structured one ["s", names,
                           [field dtypes], offsets, itemsize, aligned], or for a
                           sub-array field ["a", base dtype, shape]
17     numpy scalar        [dtype, its bytes]
18     pyarrow.Table       [offset, length] of its Arrow IPC stream
19     pyarrow.RecordBatch [offset, length] of its Arrow IPC stream (one batch)
20     pandas.DataFrame    [offset, length] of the Arrow IPC stream of
                           ``pyarrow.Table.from_pandas`` (pandas metadata kept),
                           read back with ``to_pandas``
=====  ==================  =========================================================

Everything else is refused with InvalidMessage naming its type: arrays of dtype object
(their items are Python objects), sets, arbitrary classes. Subclasses of int, float,
str, bytes, list and dict (an IntEnum, an OrderedDict) go as their base type, as
msgpack always sent them. Decoding never unpickles and refuses object dtypes, so a
tenant's bytes cannot make a consumer run code.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
import uuid
import zoneinfo
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from rayq.errors import InvalidMessage, MessageTooLarge

if TYPE_CHECKING:  # numpy is imported where an array is met: most processes never carry one
    import numpy

VALUES_TAG = 3   # the first byte of a values body (beside model.py's body tags 0 to 2)
ALIGN = 64       # each buffer starts at a multiple of this from the body's start
_HEAD = struct.Struct(">BI")

TUPLE, DATETIME, DATE, TIMEDELTA, DECIMAL, UUID = 1, 2, 3, 4, 5, 6
NDARRAY, NUMPY_SCALAR, ARROW_TABLE, ARROW_BATCH, PANDAS_FRAME = 16, 17, 18, 19, 20

CARRIED = ("msgpack values (None, bool, int, float, str, bytes, lists, dicts), tuples, "
           "numpy arrays and scalars, pyarrow Tables and RecordBatches, pandas DataFrames, "
           "datetime, date, timedelta, Decimal and UUID")

Resolve = Callable[[Any], Any]


# -- encoding -----------------------------------------------------------------------------
def pack_plain(value: Any) -> bytes | None:
    """``value`` as plain msgpack, or None when it holds anything else (a tuple, an
    array...: :func:`encode_value` makes a values body of it). Raises InvalidMessage
    for an int out of msgpack's range or nesting too deep."""
    try:
        return msgpack.packb(value, use_bin_type=True, strict_types=True)
    except TypeError:
        return None
    except (ValueError, OverflowError) as err:
        raise _unpackable(err) from err


def encode_value(value: Any, max_bytes: int, resolve: Resolve | None = None,
                 plain_prefix: bytes = b"") -> bytes:
    """``plain_prefix`` + plain msgpack when ``value`` is plain msgpack, else a values
    body. ``resolve(v)`` is asked for the value of anything of no type carried here
    (returning ``v`` itself when it has none). Raises InvalidMessage naming the first
    value that cannot go, MessageTooLarge when the encoding (less the prefix) is over
    ``max_bytes``."""
    packed = pack_plain(value)
    if packed is not None:
        if len(packed) > max_bytes:
            raise MessageTooLarge(f"body is {len(packed)} bytes; the limit is {max_bytes}")
        return plain_prefix + packed
    return _Encoder(resolve).body(value, max_bytes)


class _Encoder:
    """One values body on its way: the header's extension types, and the buffers that
    follow it (each with its offset from the first, aligned)."""

    __slots__ = ("resolve", "buffers", "size")

    def __init__(self, resolve: Resolve | None):
        self.resolve = resolve
        self.buffers: list[tuple[int, Any]] = []  # (padding before, bytes-like)
        self.size = 0  # bytes of the buffer area so far

    def pack(self, value: Any) -> bytes:
        try:
            return msgpack.packb(value, use_bin_type=True, strict_types=True,
                                 default=self.default)
        except (TypeError, ValueError, OverflowError) as err:
            raise _unpackable(err) from err

    def body(self, value: Any, max_bytes: int) -> bytes:
        header = self.pack(value)
        start = _aligned(_HEAD.size + len(header))
        total = start + self.size
        if total - 1 > max_bytes:  # refused before the buffers are copied
            raise MessageTooLarge(f"body is {total - 1} bytes; the limit is {max_bytes}")
        parts = [_HEAD.pack(VALUES_TAG, len(header)), header,
                 bytes(start - _HEAD.size - len(header))]
        for padding, data in self.buffers:
            if padding:
                parts.append(bytes(padding))
            parts.append(data)
        return b"".join(parts)  # the one copy of each buffer

    def buffer(self, data: Any, length: int) -> list[int]:
        """Place ``data`` (bytes-like, ``length`` bytes) in the buffer area: [offset, length]."""
        offset = _aligned(self.size)
        self.buffers.append((offset - self.size, data))
        self.size = offset + length
        return [offset, length]

    def default(self, value: Any) -> Any:
        """msgpack's hook for anything not plain msgpack (strict types: a subclass too)."""
        while True:
            kind = type(value)
            encode = _ENCODERS.get(kind) or _found_encoder(kind)
            if encode is not None:
                return encode(self, value)
            if self.resolve is not None:
                resolved = self.resolve(value)
                if resolved is not value:
                    if _plain_type(type(resolved)):
                        return resolved
                    value = resolved
                    continue
            raise InvalidMessage(f"{_type_name(kind)} is not a value rayq carries ({CARRIED})")


def _unpackable(err: Exception) -> InvalidMessage:
    if isinstance(err, OverflowError):
        return InvalidMessage(f"an int beyond msgpack's range (-2**63 to 2**64 - 1) cannot "
                              f"go: {err}")
    return InvalidMessage(f"cannot pack the value: {err}")


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _type_name(kind: type) -> str:
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


_PLAIN = (type(None), bool, int, float, str, bytes, list, dict)


def _plain_type(kind: type) -> bool:
    return kind in _PLAIN


def _tuple(enc: _Encoder, value: tuple) -> msgpack.ExtType:
    return msgpack.ExtType(TUPLE, enc.pack(list(value)))


def _datetime(enc: _Encoder, value: datetime.datetime) -> msgpack.ExtType:
    fields = [value.year, value.month, value.day, value.hour, value.minute, value.second,
              value.microsecond, value.fold, _tz(value.tzinfo)]
    return msgpack.ExtType(DATETIME, msgpack.packb(fields, use_bin_type=True))


def _tz(tz: datetime.tzinfo | None) -> Any:
    if tz is None:
        return None
    if type(tz) is datetime.timezone:
        offset, *name = tz.__getinitargs__()
        return ["fixed", offset.days, offset.seconds, offset.microseconds, *name]
    if type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        return ["zone", tz.key]
    raise InvalidMessage(f"a datetime with tzinfo {_type_name(type(tz))} cannot go: use "
                         f"datetime.timezone or zoneinfo.ZoneInfo")


def _date(enc: _Encoder, value: datetime.date) -> msgpack.ExtType:
    return msgpack.ExtType(DATE, msgpack.packb([value.year, value.month, value.day]))


def _timedelta(enc: _Encoder, value: datetime.timedelta) -> msgpack.ExtType:
    return msgpack.ExtType(TIMEDELTA, msgpack.packb([value.days, value.seconds,
                                                     value.microseconds]))


def _decimal(enc: _Encoder, value: decimal.Decimal) -> msgpack.ExtType:
    return msgpack.ExtType(DECIMAL, str(value).encode())


def _uuid(enc: _Encoder, value: uuid.UUID) -> msgpack.ExtType:
    return msgpack.ExtType(UUID, value.bytes)


def _dtype_spec(dtype: numpy.dtype) -> Any:
    """How a dtype travels: its ``str``, or the parts of a structured or sub-array one."""
    if dtype.hasobject:
        raise InvalidMessage(f"numpy arrays of dtype {dtype} cannot go: their items are "
                             f"Python objects, which rayq never pickles")
    if dtype.fields is not None:
        names = list(dtype.names)
        return ["s", names, [_dtype_spec(dtype.fields[n][0]) for n in names],
                [dtype.fields[n][1] for n in names], dtype.itemsize, dtype.isalignedstruct]
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return ["a", _dtype_spec(base), list(shape)]
    return dtype.str


def _ndarray(enc: _Encoder, value: numpy.ndarray) -> msgpack.ExtType:
    import numpy
    spec = _dtype_spec(value.dtype)
    if value.flags.c_contiguous:
        order, flat = "C", value
    elif value.flags.f_contiguous:
        order, flat = "F", value.T  # the same memory, C-contiguous
    else:  # a strided view: its items gathered once
        order, flat = "C", numpy.ascontiguousarray(value)
    data = memoryview(flat.reshape(-1).view(numpy.uint8)) if value.nbytes else b""
    header = [spec, list(value.shape), order, *enc.buffer(data, value.nbytes)]
    return msgpack.ExtType(NDARRAY, msgpack.packb(header, use_bin_type=True))


def _numpy_scalar(enc: _Encoder, value: numpy.generic) -> msgpack.ExtType:
    import numpy
    array = numpy.asarray(value)  # its dtype as an array holds it (b"" is one NUL byte)
    return msgpack.ExtType(NUMPY_SCALAR, msgpack.packb(
        [_dtype_spec(array.dtype), array.tobytes()], use_bin_type=True))


def _arrow_stream(enc: _Encoder, code: int, table: Any, write: str) -> msgpack.ExtType:
    import pyarrow  # present: the value is one of its types
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        getattr(writer, write)(table)
    stream = sink.getvalue()
    return msgpack.ExtType(code, msgpack.packb(enc.buffer(stream, stream.size)))


def _arrow_table(enc: _Encoder, value: Any) -> msgpack.ExtType:
    return _arrow_stream(enc, ARROW_TABLE, value, "write_table")


def _arrow_batch(enc: _Encoder, value: Any) -> msgpack.ExtType:
    return _arrow_stream(enc, ARROW_BATCH, value, "write_batch")


def _pandas_frame(enc: _Encoder, value: Any) -> msgpack.ExtType:
    import pyarrow
    try:
        table = pyarrow.Table.from_pandas(value)
    except (pyarrow.ArrowException, TypeError, ValueError) as err:
        raise InvalidMessage(f"a pandas DataFrame that Arrow cannot hold cannot go "
                             f"(object columns of Python objects, ...): {err}") from err
    return _arrow_stream(enc, PANDAS_FRAME, table, "write_table")


def _base(convert: Callable[[Any], Any]) -> Callable[[_Encoder, Any], Any]:
    return lambda enc, value: convert(value)


_ENCODERS: dict[type, Callable[[_Encoder, Any], Any]] = {
    tuple: _tuple, datetime.datetime: _datetime, datetime.date: _date,
    datetime.timedelta: _timedelta, decimal.Decimal: _decimal, uuid.UUID: _uuid,
    bytearray: _base(bytes), memoryview: _base(bytes),
}
# Subclasses of msgpack's own types go as their base type, as msgpack always sent them.
_BASES: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (bool, bool), (int, int.__int__), (float, float.__float__), (str, str.__str__),
    (bytes, bytes), (bytearray, bytes), (memoryview, bytes), (list, list), (dict, dict))


def _found_encoder(kind: type) -> Callable[[_Encoder, Any], Any] | None:
    """The encoder of a type first met (then kept), or None: not carried."""
    encode = None
    module = kind.__module__.split(".")[0]
    if issubclass(kind, tuple):
        encode = _tuple
    elif module == "numpy":
        import numpy  # present: the value is one of its types
        encode = _ndarray if kind is numpy.ndarray \
            else _numpy_scalar if issubclass(kind, numpy.generic) else None
    elif module == "pyarrow":
        import pyarrow
        encode = {pyarrow.Table: _arrow_table, pyarrow.RecordBatch: _arrow_batch}.get(kind)
    elif module == "pandas":
        import pandas
        encode = _pandas_frame if kind is pandas.DataFrame else None
    else:
        encode = next((_base(convert) for base, convert in _BASES if issubclass(kind, base)),
                      None)
    if encode is not None:
        _ENCODERS[kind] = encode
    return encode


# -- decoding -----------------------------------------------------------------------------
def unpack_plain(data: Any) -> Any:
    """Plain msgpack (bytes-like), as :func:`pack_plain` makes it: no extension types.
    Raises InvalidMessage."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData) as err:
        raise InvalidMessage(f"malformed msgpack: {err}") from err


def decode_value(data: bytes, plain_offset: int = 0) -> Any:
    """The value :func:`encode_value` was given: a values body, or plain msgpack from
    ``plain_offset`` on. Raises InvalidMessage for anything else."""
    if data[:1] != bytes([VALUES_TAG]):
        return unpack_plain(memoryview(data)[plain_offset:])
    return decode(data)


def decode(body: bytes) -> Any:
    """The value of a values body. Raises InvalidMessage when it is not one."""
    if len(body) < _HEAD.size:
        raise InvalidMessage("a values body is shorter than its header")
    tag, header_len = _HEAD.unpack_from(body)
    if tag != VALUES_TAG or _HEAD.size + header_len > len(body):
        raise InvalidMessage("not a values body")
    view = memoryview(body)
    decoder = _Decoder(view[_aligned(_HEAD.size + header_len):])
    try:
        return decoder.unpack(view[_HEAD.size:_HEAD.size + header_len])
    except InvalidMessage:
        raise
    except Exception as err:  # any malformed part is the sender's
        raise InvalidMessage(f"malformed values body: {err!r:.200}") from err


class _Decoder:
    __slots__ = ("area",)

    def __init__(self, area: memoryview):
        self.area = area

    def unpack(self, data: Any) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=self.ext)

    def buffer(self, offset: Any, length: Any) -> memoryview:
        if (type(offset) is not int or type(length) is not int or offset < 0 or length < 0
                or offset + length > len(self.area)):
            raise InvalidMessage("a values body's buffer lies outside it")
        return self.area[offset:offset + length]

    def ext(self, code: int, data: bytes) -> Any:
        decode = _DECODERS.get(code)
        if decode is None:
            raise InvalidMessage(f"unknown value type {code} in a values body")
        return decode(self, data)


def _fields(data: bytes) -> list:
    fields = msgpack.unpackb(data, raw=False)
    if not isinstance(fields, list):
        raise InvalidMessage("malformed value in a values body")
    return fields


def _read_datetime(dec: _Decoder, data: bytes) -> datetime.datetime:
    *fields, fold, tz = _fields(data)
    return datetime.datetime(*fields, tzinfo=_read_tz(tz), fold=fold)


def _read_tz(tz: Any) -> datetime.tzinfo | None:
    if tz is None:
        return None
    if tz[0] == "fixed":
        return datetime.timezone(datetime.timedelta(tz[1], tz[2], tz[3]), *tz[4:])
    if tz[0] == "zone" and isinstance(tz[1], str):
        return zoneinfo.ZoneInfo(tz[1])
    raise InvalidMessage("malformed time zone in a values body")


def _read_ndarray(dec: _Decoder, data: bytes) -> numpy.ndarray:
    import numpy
    spec, shape, order, offset, length = _fields(data)
    dtype = _read_dtype(spec)
    if (not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape)
            or order not in ("C", "F")):
        raise InvalidMessage("malformed array in a values body")
    if math.prod(shape) * dtype.itemsize != length:
        raise InvalidMessage("an array's bytes do not match its shape and dtype")
    raw = dec.buffer(offset, length)
    if length == 0:
        array = numpy.empty(shape, dtype, order=order)
        array.flags.writeable = False  # as every array given back
        return array
    return numpy.frombuffer(raw, dtype=dtype).reshape(shape, order=order)


def _read_dtype(spec: Any) -> numpy.dtype:
    import numpy
    if isinstance(spec, str):
        dtype = numpy.dtype(spec)
    elif isinstance(spec, list) and spec and spec[0] == "s":
        _, names, formats, offsets, itemsize, aligned = spec
        dtype = numpy.dtype({"names": names, "formats": [_read_dtype(f) for f in formats],
                             "offsets": offsets, "itemsize": itemsize}, align=bool(aligned))
    elif isinstance(spec, list) and spec and spec[0] == "a":
        dtype = numpy.dtype((_read_dtype(spec[1]), tuple(spec[2])))
    else:
        raise InvalidMessage("malformed dtype in a values body")
    if dtype.hasobject:  # never: an object array's bytes would be pointers
        raise InvalidMessage("a values body may not hold arrays of dtype object")
    return dtype


def _read_numpy_scalar(dec: _Decoder, data: bytes) -> numpy.generic:
    import numpy
    spec, raw = _fields(data)
    dtype = _read_dtype(spec)
    if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        raise InvalidMessage("a numpy scalar's bytes do not match its dtype")
    array = numpy.frombuffer(raw, dtype=dtype) if raw else numpy.zeros(1, dtype)
    return array.reshape(())[()]


def _read_arrow(dec: _Decoder, data: bytes) -> Any:
    import pyarrow
    offset, length = _fields(data)
    return pyarrow.ipc.open_stream(pyarrow.py_buffer(dec.buffer(offset, length)))


def _read_arrow_table(dec: _Decoder, data: bytes) -> Any:
    table = _read_arrow(dec, data).read_all()
    table.validate(full=True)  # a tenant's stream: checked before anyone reads it
    return table


def _read_arrow_batch(dec: _Decoder, data: bytes) -> Any:
    reader = _read_arrow(dec, data)
    batch = reader.read_next_batch()
    try:
        reader.read_next_batch()
    except StopIteration:
        batch.validate(full=True)
        return batch
    raise InvalidMessage("a RecordBatch's stream holds more than one batch")


def _read_pandas_frame(dec: _Decoder, data: bytes) -> Any:
    try:
        import pandas  # noqa: F401 (to_pandas needs it)
    except ImportError as err:
        raise InvalidMessage("a pandas DataFrame cannot be read where pandas is not "
                             "installed") from err
    return _read_arrow_table(dec, data).to_pandas()


_DECODERS: dict[int, Callable[[_Decoder, bytes], Any]] = {
    TUPLE: lambda dec, data: tuple(dec.unpack(data)),
    DATETIME: _read_datetime,
    DATE: lambda dec, data: datetime.date(*_fields(data)),
    TIMEDELTA: lambda dec, data: datetime.timedelta(*_fields(data)),
    DECIMAL: lambda dec, data: decimal.Decimal(data.decode()),
    UUID: lambda dec, data: uuid.UUID(bytes=data),
    NDARRAY: _read_ndarray,
    NUMPY_SCALAR: _read_numpy_scalar,
    ARROW_TABLE: _read_arrow_table,
    ARROW_BATCH: _read_arrow_batch,
    PANDAS_FRAME: _read_pandas_frame,
}
