"""Frames of the local channel: a shard's calls over a Unix socket on its own host.

A Ray actor call costs about 0.9 ms of round trip on the 2-core machine; the same
request over a Unix socket costs about 0.05 ms. Clients and consumers on a shard's
host therefore send the hot calls (put, receive, delete, ...) over a socket the shard
listens on, and everything else through Ray. This module is the wire format only.

A frame is a 4-byte big-endian length and a msgpack payload:
- request: ``[id, method, args, kwargs, auth]``, auth the six fields of a Signature
  or nil. Requests are plain msgpack: the shard never unpickles what a client sends.
- reply: ``[id, OK, result]`` or ``[id, FAILED, pickled exception]``. The exception
  comes from the shard the client already trusts with its messages, and pickling keeps
  a RayqError's class and fields (ReceiptInvalid's receipts) as a Ray call would.

Results may hold RayqError values (``end_many`` answers one per call); they travel as
an extension type, pickled the same way.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

import msgpack

from rayq.core.codec.model import Signature
from rayq.errors import InvalidMessage

HEADER = struct.Struct(">I")
# bodies travel whole (a blob is only how the store keeps one): larger requests go through Ray
MAX_FRAME_BYTES = 256 << 20
OK, FAILED = 0, 1
_ERROR_EXT = 1


class FrameError(ValueError):
    """A frame that is not a channel request or reply (a stranger on the socket)."""


class FrameTooLarge(FrameError):
    """Raised by encode_request for a request over MAX_FRAME_BYTES (a send_batch of
    large bodies): the shard would drop the connection, and every call on it. Ray,
    whose object store takes large arguments, carries it instead."""


def _default(value: Any) -> Any:
    if isinstance(value, BaseException):
        return msgpack.ExtType(_ERROR_EXT, pickle.dumps(value))
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot send {type(value).__name__} over the channel")


def _plain(value: Any) -> Any:
    """A request holds msgpack's own types only: nothing the shard would unpickle."""
    raise InvalidMessage(f"cannot send {type(value).__name__} over the channel")


def _refuse_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"a request may not carry extension type {code}")


def _signature(signed: Any) -> Signature | None:
    """The request's Signature, its fields of the types the gate reads (or nil)."""
    if signed is None:
        return None
    if not (isinstance(signed, list) and len(signed) == 6
            and all(isinstance(signed[i], str) for i in (0, 1, 2, 4, 5))
            and isinstance(signed[3], (int, float)) and not isinstance(signed[3], bool)):
        raise FrameError("a request's auth is not the six fields of a Signature")
    return Signature(*signed)


def _ext(code: int, data: bytes) -> Any:
    if code == _ERROR_EXT:
        return pickle.loads(data)
    return msgpack.ExtType(code, data)


def _frame(payload: list, default=_default) -> bytes:
    body = msgpack.packb(payload, default=default, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def encode_request(call_id: int, method: str, args: tuple, kwargs: dict,
                   auth: Signature | None) -> bytes:
    """Raises InvalidMessage for an argument that is not plain msgpack (an object, an
    exception): the shard takes no pickles; FrameTooLarge past MAX_FRAME_BYTES."""
    signed = None if auth is None else [auth.account, auth.queue, auth.operation,
                                        auth.timestamp, auth.nonce, auth.mac]
    frame = _frame([call_id, method, list(args), kwargs, signed], default=_plain)
    if len(frame) - HEADER.size > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"a {method} request of {len(frame)} bytes")
    return frame


def decode_request(body: bytes) -> tuple[int, str, list, dict, Signature | None]:
    """(id, method, args, kwargs, auth). No extension types are accepted from clients:
    one raises FrameError unopened."""
    try:
        call_id, method, args, kwargs, signed = msgpack.unpackb(
            body, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
        auth = _signature(signed)
    except FrameError:
        raise
    except Exception as err:  # any malformed frame is the sender's
        raise FrameError(f"not a channel request: {err}") from err
    if not (isinstance(call_id, int) and isinstance(method, str) and isinstance(args, list)
            and isinstance(kwargs, dict)):
        raise FrameError("not a channel request")
    return call_id, method, args, kwargs, auth


def encode_reply(call_id: int, result: Any) -> bytes:
    return _frame([call_id, OK, result])


def encode_failure(call_id: int, error: BaseException) -> bytes:
    return _frame([call_id, FAILED, pickle.dumps(error)])


def decode_reply(body: bytes) -> tuple[int, bool, Any]:
    """(id, ok, result or the exception)."""
    call_id, status, value = msgpack.unpackb(body, raw=False, strict_map_key=False,
                                             ext_hook=_ext)
    if status == FAILED:
        return call_id, False, pickle.loads(value)
    return call_id, True, value
