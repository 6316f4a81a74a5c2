"""Task values beyond msgpack (rayq/core/codec/values.py): every type carried comes back
as the same type with the same value, as an argument and as a result; the rest is
refused naming its type; bodies read from the wire never run code."""

import collections
import datetime
import decimal
import enum
import struct
import uuid
import zoneinfo

import msgpack
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from rayq.config import Config, StoreConfig
from rayq.core.codec import values
from rayq.core.codec.model import decode_body, encode_body, pack
from rayq.core.codec.task_ids import TaskState, task_state
from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import (decode_call, decode_outcome, encode_call, encode_error,
                                   encode_result, outcome_succeeded)
from rayq.core.codec.wire import Attrs, decode_put, encode_put
from rayq.errors import ConfigError, InvalidMessage, MessageTooLarge, TaskError

try:
    import pandas as pd
except ImportError:  # pandas is optional: DataFrames go when it is importable
    pd = None

LIMIT = 1 << 30
UTC, PLUS_2 = datetime.timezone.utc, datetime.timezone(datetime.timedelta(hours=2), "CEST")


def as_argument(value):
    args, kwargs = decode_call(encode_call("t", (value,), {"k": value}, LIMIT))
    assert same(args[0], kwargs["k"])
    return args[0]


def as_result(value):
    return decode_outcome(encode_result(value, "t"))


def same(a, b) -> bool:
    """Equal, of the very same types all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return (a.dtype == b.dtype and a.shape == b.shape
                and a.flags.f_contiguous == b.flags.f_contiguous
                and a.flags.c_contiguous == b.flags.c_contiguous
                and a.tobytes(order="A") == b.tobytes(order="A"))
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (pa.Table, pa.RecordBatch)):
        return a.equals(b, check_metadata=True)
    if pd is not None and isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        return True
    if isinstance(a, float):  # bit for bit: NaN equals NaN, -0.0 differs from 0.0
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, decimal.Decimal) and a.is_nan():
        return b.is_nan() and str(a) == str(b)
    if isinstance(a, datetime.datetime):
        return (a == b and a.tzinfo == b.tzinfo and a.fold == b.fold
                and a.utcoffset() == b.utcoffset())
    return a == b


ARRAYS = [
    np.arange(12, dtype=np.float64),
    np.arange(24, dtype=">i4").reshape(2, 3, 4),
    np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
    np.arange(20)[::3],  # strided: gathered, comes back contiguous with the same values
    np.array(7.5),
    np.zeros((0, 3)),
    np.zeros(0, dtype="U0"),
    np.array([True, False]),
    np.array(["a", "héllo"]),
    np.array([b"x", b""]),
    np.array(["2020-01-01T00:00:00.123456789", "NaT"], dtype="datetime64[ns]"),
    np.array([1, -2], dtype="timedelta64[ms]"),
    np.array([1 + 2j, np.nan]),
    np.array([np.float16(0.5)]),
    np.zeros(3, dtype=[("a", "u1"), ("b", "<f8", (2,)), ("c", "S3")]),
    np.zeros(2, dtype=np.dtype([("a", "u1"), ("b", "<i4")], align=True)),
    np.frombuffer(b"\x01\x02\x03\x04", dtype="V2"),
]
SCALARS = [np.float64(1.5), np.float32(-0.0), np.int8(-3), np.uint64(2**64 - 1), np.bool_(True),
           np.str_("hé"), np.str_(""), np.bytes_(b""), np.complex64(1 - 1j),
           np.datetime64("2020-01-01T00:00:00.123456789"), np.timedelta64(5, "h"),
           np.longdouble(1) / 3, np.zeros(1, dtype=[("a", "<i2")])[0]]
PLAIN_KINDS = [
    (1, (2, [3, (4,)]), ()),
    [float("nan"), -0.0, float("-inf"), 1e-310],
    {"t": (1, "a"), (1, 2): "tuple key"},
    datetime.datetime(2024, 2, 29, 23, 59, 59, 999999),
    datetime.datetime(2024, 2, 29, 1, 2, 3, 4, tzinfo=UTC),
    datetime.datetime(1, 1, 1, tzinfo=PLUS_2),
    datetime.datetime(2021, 11, 7, 1, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
    datetime.date(1999, 12, 31),
    datetime.timedelta(days=-3, seconds=5, microseconds=7),
    decimal.Decimal("3.14159265358979323846264338327950288"),
    decimal.Decimal("-0.000"), decimal.Decimal("NaN"), decimal.Decimal("-Infinity"),
    decimal.Decimal("1E+999999"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
]


def tables():
    table = pa.table({"x": pa.array([1, None, 3], pa.int64()), "s": ["a", "b", None],
                      "l": [[1.5], [], None], "ts": pa.array([0, 1, 2], pa.timestamp("us", "UTC"))},
                     metadata={b"owner": b"acme"})
    return [table, table.slice(1, 1), table.to_batches()[0],
            pa.table({"e": pa.array([], pa.int8())}), pa.concat_tables([table, table])]


@pytest.mark.parametrize("value", PLAIN_KINDS + ARRAYS + SCALARS + tables(),
                         ids=lambda v: type(v).__name__)
def test_every_value_carried_round_trips_exactly_as_an_argument_and_as_a_result(value):
    expected = value
    if isinstance(value, np.ndarray) and not (value.flags.c_contiguous or value.flags.f_contiguous):
        expected = np.ascontiguousarray(value)  # a strided view comes back gathered
    assert same(as_argument(value), expected)
    assert same(as_result(value), expected)


def test_values_nest_in_lists_dicts_and_tuples_and_keep_their_places():
    value = {"batch": [np.arange(3), (np.float32(1), datetime.date(2020, 1, 1))],
             "meta": (uuid.UUID(int=5), [decimal.Decimal("1.10")]), "plain": [1, "x", None]}
    assert same(as_argument(value), value)
    assert same(as_result(value), value)


@pytest.mark.skipif(pd is None, reason="pandas is not installed: DataFrames are not carried")
@pytest.mark.parametrize("frame", [
    lambda: pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "f": [0.5, np.nan]}),
    lambda: pd.DataFrame({"a": [1, 2]}, index=pd.Index([10, 20], name="id")),
    lambda: pd.DataFrame({0: [1.5], 1: [2.5]}),
    lambda: pd.DataFrame({"t": pd.to_datetime(["2020-01-01", "2021-06-01"]).tz_localize("UTC"),
                          "c": pd.Categorical(["u", "v"]), "n": pd.array([1, None], "Int64")}),
    lambda: pd.DataFrame(),
])
def test_pandas_dataframes_round_trip_through_arrow(frame):
    df = frame()
    assert same(as_argument(df), df)
    assert same(as_result(df), df)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hnp.arrays(dtype=st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(),
                                  hnp.unicode_string_dtypes()),
                  shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)),
       st.booleans())
def test_any_array_of_a_plain_dtype_round_trips_exactly(array, fortran):
    if fortran:
        array = np.asfortranarray(array)
    assert same(as_argument(array), array)


leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                   st.text(max_size=5), st.binary(max_size=5), st.datetimes(),
                   st.datetimes(timezones=st.just(UTC)), st.dates(), st.timedeltas(),
                   st.decimals(allow_nan=False), st.uuids())


@settings(max_examples=100, deadline=None)
@given(st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.tuples(inner, inner),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=12))
def test_any_nesting_of_plain_values_and_tuples_round_trips_exactly(value):
    assert same(as_argument(value), value)
    assert same(as_result(value), value)


class Colour(enum.IntEnum):
    RED = 1


def test_subclasses_of_msgpack_types_go_as_their_base_types_and_named_tuples_as_tuples():
    Point = collections.namedtuple("Point", "x y")
    got = as_argument([Colour.RED, collections.OrderedDict(a=1), Point(1, 2), bytearray(b"b")])
    assert same(got, [1, {"a": 1}, (1, 2), b"b"])


def test_a_call_of_plain_values_keeps_the_plain_msgpack_body_it_always_had():
    body = encode_call("t", (1, 2), {"k": "v"}, LIMIT)
    assert body == encode_body([[1, 2], {"k": "v"}], LIMIT)
    assert decode_call(body) == ([1, 2], {"k": "v"})
    assert encode_result({"ok": 1}, "t") == pack([True, {"ok": 1}])  # outcomes kept before


def test_a_call_of_plain_values_never_reaches_the_values_encoder(monkeypatch):
    def no_encoder(resolve):
        raise AssertionError("a plain call went through the values encoder")

    monkeypatch.setattr(values, "_Encoder", no_encoder)
    body = encode_call("t", (1, 2, 3), {"k": [None, 1.5]}, LIMIT, resolve=no_encoder)
    assert decode_call(body) == ([1, 2, 3], {"k": [None, 1.5]})
    assert decode_outcome(encode_result([4, "x"], "t")) == [4, "x"]


def test_a_call_beyond_msgpack_is_a_values_body_that_the_queue_api_also_reads():
    body = encode_call("t", ((1, 2),), {}, LIMIT)
    assert body[0] == values.VALUES_TAG
    assert same(decode_body(body), [[(1, 2)], {}])


def test_arrays_are_read_in_place_from_the_received_bytes_and_are_read_only():
    body = encode_call("t", (np.arange(1000, dtype=np.float64),), {}, LIMIT)
    array = decode_call(body)[0][0]
    start = np.frombuffer(body, np.uint8).ctypes.data
    assert start <= array.ctypes.data < start + len(body)
    assert array.ctypes.data % 8 == 0
    assert not array.flags.writeable
    table = decode_call(encode_call("t", (pa.table({"x": np.arange(1000)}),), {}, LIMIT))[0][0]
    body = encode_call("t", (pa.table({"x": np.arange(1000)}),), {}, LIMIT)
    column = decode_call(body)[0][0].column("x").chunk(0).buffers()[1]
    start = np.frombuffer(body, np.uint8).ctypes.data
    assert start <= column.address < start + len(body)
    assert table.column("x").to_pylist() == list(range(1000))


def test_an_object_refs_value_is_what_resolve_gives_at_any_depth():
    class Ref:
        def __init__(self, value):
            self.value = value

    def resolve(v):
        return v.value if isinstance(v, Ref) else v

    body = encode_call("t", (Ref(np.arange(3)), [Ref(Ref((1, 2)))]), {"k": Ref(5)}, LIMIT,
                       resolve=resolve)
    args, kwargs = decode_call(body)
    assert same(args, [np.arange(3), [(1, 2)]]) and kwargs == {"k": 5}
    with pytest.raises(InvalidMessage, match="Ref"):
        encode_call("t", (Ref(1),), {}, LIMIT)  # nobody to read it: refused, naming it


class Mystery:
    pass


class OwnZone(datetime.tzinfo):
    def utcoffset(self, dt):
        return datetime.timedelta(0)


@pytest.mark.parametrize("value, named", [
    (np.array([1, "a"], dtype=object), "dtype object"),
    (np.zeros(2, dtype=[("o", object)]), "dtype"),
    ({1, 2}, "set"), (frozenset(), "frozenset"), (Mystery(), "Mystery"),
    (datetime.datetime(2020, 1, 1, tzinfo=OwnZone()), "OwnZone"),
    (np.ma.array([1, 2]), "MaskedArray"), (np.char.array(["a"]), "chararray"),
    (2**64, "int"), (datetime.time(1, 2), "time"),
])
def test_a_value_not_carried_is_refused_naming_its_type(value, named):
    with pytest.raises(InvalidMessage, match=named) as err:
        encode_call("t", (value,), {}, LIMIT)
    assert type(err.value) is InvalidMessage
    with pytest.raises(InvalidMessage, match=named):
        encode_result([value], "t")


@pytest.mark.skipif(pd is None, reason="pandas is not installed")
def test_a_dataframe_arrow_cannot_hold_and_a_pandas_timestamp_are_refused():
    with pytest.raises(InvalidMessage, match="DataFrame"):
        encode_call("t", (pd.DataFrame({"o": [Mystery()]}),), {}, LIMIT)
    with pytest.raises(InvalidMessage, match="Timestamp"):
        encode_call("t", (pd.Timestamp(0),), {}, LIMIT)


def test_a_call_or_result_over_the_limit_is_too_large_before_its_buffers_are_copied():
    big = np.zeros(1000, np.uint8)
    with pytest.raises(MessageTooLarge):
        encode_call("t", (big,), {}, 999)
    with pytest.raises(MessageTooLarge):
        encode_result((big,), "t", max_bytes=999)
    with pytest.raises(MessageTooLarge):
        encode_call("t", (b"x" * 1000,), {}, 999)
    assert decode_call(encode_call("t", (big,), {}, 1200))[0][0].nbytes == 1000


def test_an_outcomes_state_is_read_from_its_first_bytes_in_both_encodings():
    for outcome, ok in [(encode_result(1, "t"), True), (encode_result((1,), "t"), True),
                        (encode_result(np.arange(3), "t"), True),
                        (encode_error("KeyError", "x"), False), (pack([True, 1]), True)]:
        assert outcome_succeeded(outcome) is ok
        expected = TaskState.SUCCEEDED if ok else TaskState.FAILED
        assert task_state(Ending.RESULT, outcome, running=False) is expected
    with pytest.raises(TaskError):
        decode_outcome(encode_error("KeyError", "x"))


def values_body(header: bytes, area: bytes = b"") -> bytes:
    head = struct.pack(">BI", values.VALUES_TAG, len(header)) + header
    return head + bytes(-len(head) % values.ALIGN) + area


def ext(code: int, fields) -> msgpack.ExtType:
    return msgpack.ExtType(code, msgpack.packb(fields, use_bin_type=True))


def call_of(item, area: bytes = b"") -> bytes:
    return values_body(msgpack.packb([[item], {}], use_bin_type=True), area)


@pytest.mark.parametrize("body", [
    call_of(ext(values.NDARRAY, ["|O", [1], "C", 0, 8]), bytes(8)),
    call_of(ext(values.NDARRAY, [["s", ["o"], ["|O"], [0], 8, False], [1], "C", 0, 8]), bytes(8)),
    call_of(ext(values.NUMPY_SCALAR, ["|O", bytes(8)])),
    call_of(ext(values.NDARRAY, ["<f8", [2], "C", 0, 16]), bytes(8)),
    call_of(ext(values.NDARRAY, ["<f8", [3], "C", 0, 16]), bytes(16)),
    call_of(ext(values.NDARRAY, ["<f8", [2], "X", 0, 16]), bytes(16)),
    call_of(ext(values.NDARRAY, ["<f8", [2], "C", -8, 16]), bytes(16)),
    call_of(msgpack.ExtType(99, b"")),
    call_of(ext(values.DATETIME, [2020, 13, 1, 0, 0, 0, 0, 0, None])),
    call_of(ext(values.DATETIME, [2020, 1, 1, 0, 0, 0, 0, 0, ["zone", "../../etc/passwd"]])),
    call_of(msgpack.ExtType(values.DECIMAL, b"\xff")),
    call_of(msgpack.ExtType(values.DECIMAL, b"pi")),
    call_of(msgpack.ExtType(values.UUID, b"short")),
    call_of(ext(values.ARROW_TABLE, [0, 64]), bytes(64)),
    call_of(ext(values.ARROW_TABLE, [0, 64]), bytes(8)),
    call_of(msgpack.ExtType(values.TUPLE, b"\xc1")),
    values_body(b"\x92\x91"),
    struct.pack(">BI", values.VALUES_TAG, 1000) + b"\x90",
    bytes([values.VALUES_TAG]),
], ids=lambda b: b[5:40].hex())
def test_a_malformed_values_body_is_refused_clearly_and_never_made_an_object_array(body):
    with pytest.raises(InvalidMessage):
        decode_call(body)


def test_a_put_carries_a_task_body_up_to_the_task_limit_and_a_message_to_the_message_limit():
    task, message = Attrs("acme", "t", "t", task=True), Attrs("acme", "q", "q")
    body = b"\x00" + bytes(2000)
    limits = dict(max_message_bytes=1000, max_task_bytes=3000, max_delay_s=10, max_ttl_s=10)
    assert decode_put(encode_put([(task, body)]), **limits).bodies == [body]
    with pytest.raises(MessageTooLarge):
        decode_put(encode_put([(task, body), (message, body)]), **limits)
    with pytest.raises(MessageTooLarge):
        decode_put(encode_put([(task, body + bytes(1001))]), **limits)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, (1 << 30) + 1])
def test_a_body_limit_out_of_range_is_a_config_error(limit):
    with pytest.raises(ConfigError, match="max_task_bytes"):
        Config(store=StoreConfig(max_task_bytes=limit))
    assert Config().store.max_task_bytes == 256 << 20


# -- a shard's answers ---------------------------------------------------------------------
def test_a_receive_hands_out_bodies_within_its_byte_bound_and_leaves_the_rest_visible(
        tmp_path, monkeypatch):
    from rayq.core.codec.model import NewMessage
    from rayq.core.kit.kv import LmdbKV
    from rayq.core.storage import messages
    from rayq.core.storage.store import ShardStore
    from rayq.core.storage.writes import Put
    from rayq.testing import FakeClock, plenty_of_memory
    from tests.contract.helpers import batch, received

    monkeypatch.setattr(messages, "MAX_ANSWER_BYTES", 2500)
    store = ShardStore(LmdbKV(tmp_path / "shard"), clock=FakeClock(),
                       config=StoreConfig(blob_threshold_bytes=1024, blob_chunk_bytes=300),
                       memory_probe=plenty_of_memory)
    bodies = [bytes([i]) * 1000 for i in range(3)] + [bytes([9]) * 3000, b"small"]
    store.run(Put(0, batch(*(NewMessage(encode_body(b, LIMIT), "acme", "t", "k")
                             for b in bodies))))
    answers = [[decode_body(m.body) for m in received(store, 0, 10, 60)] for _ in range(4)]
    store.close()
    # inline rows of 1 001 bytes two at a time; a 3 001-byte blob alone, over the bound
    assert answers == [bodies[:2], [bodies[2]], [bodies[3]], [bodies[4]]]
