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

from rayq.core.auth import Signature

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 << 20  # a put of 1000 messages of 16 MiB is a blob reference each
OK, FAILED = 0, 1
_ERROR_EXT = 1


class FrameError(ValueError):
    """A frame that is not a channel request or reply (a stranger on the socket)."""


def _default(value: Any) -> Any:
    if isinstance(value, BaseException):
        return msgpack.ExtType(_ERROR_EXT, pickle.dumps(value))
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot send {type(value).__name__} over the channel")


def _ext(code: int, data: bytes) -> Any:
    if code == _ERROR_EXT:
        return pickle.loads(data)
    return msgpack.ExtType(code, data)


def _frame(payload: list) -> bytes:
    body = msgpack.packb(payload, default=_default, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def encode_request(call_id: int, method: str, args: tuple, kwargs: dict,
                   auth: Signature | None) -> bytes:
    signed = None if auth is None else [auth.account, auth.queue, auth.operation,
                                        auth.timestamp, auth.nonce, auth.mac]
    return _frame([call_id, method, list(args), kwargs, signed])


def decode_request(body: bytes) -> tuple[int, str, list, dict, Signature | None]:
    """(id, method, args, kwargs, auth). No extension types are accepted from clients."""
    try:
        call_id, method, args, kwargs, signed = msgpack.unpackb(
            body, raw=False, strict_map_key=True)
        auth = None if signed is None else Signature(*signed)
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
