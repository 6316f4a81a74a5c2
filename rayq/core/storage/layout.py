"""How one message is stored: a row value with a fixed header, then the body as sent.

    header  enqueued_at µs (8) | expires_at µs (8) | dequeue count (4) | flags (1)
            | nonce (8) | tenant bytes (2) | type bytes (2)
    then    tenant | type | body (the encoded body, or a blob reference)

Every row of one put shares its header but for nothing at all, so a put writes
``prefix + body`` per message; a receive rewrites only the dequeue count and the
nonce, a move (visibility change, dead-letter, sweep) copies the value as it is,
and a pop receipt is checked by comparing 8 bytes. Nothing on these paths decodes
or re-encodes a body. Row keys are (subqueue, key id, visible_at µs, seq); a
message's id is its store's id and its seq, so it is not stored either.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

HEAD = struct.Struct(">QQIB8sHH")
DEQUEUE = struct.Struct(">I")
BLOB_REF = struct.Struct(">14sQI")   # blob id (store id + seq), size bytes, chunks
TASK, BLOB = 1, 2                    # flags
NO_NONCE = bytes(8)                  # a row never received: no receipt can match it
_NONCE_AT, _NONCE_END = 21, 29
_EXPIRES = slice(8, 16)
_U64 = struct.Struct(">Q")


def prefix(enqueued_us: int, expires_us: int, flags: int, tenant: bytes, type_: bytes) -> bytes:
    """The header and names shared by the rows of one put with these attributes."""
    return HEAD.pack(enqueued_us, expires_us, 0, flags, NO_NONCE, len(tenant), len(type_)) \
        + tenant + type_


class RowMeta(NamedTuple):
    """A row's header fields and where its body starts."""

    enqueued_us: int
    expires_us: int
    dequeue_count: int
    flags: int
    nonce: bytes
    tenant: str
    type: str
    body_at: int

    @property
    def task(self) -> bool:
        return bool(self.flags & TASK)


_NAMES: dict[bytes, tuple[str, str]] = {}  # decoded (tenant, type) by their raw bytes
_NAMES_KEPT = 10_000


def meta(value: bytes) -> RowMeta:
    enqueued, expires, dequeues, flags, nonce, tenant_len, type_len = HEAD.unpack_from(value)
    body_at = HEAD.size + tenant_len + type_len
    raw = value[HEAD.size - 4:body_at]  # both lengths and both names: unambiguous
    names = _NAMES.get(raw)
    if names is None:  # few distinct (tenant, type) pairs: decode each once
        if len(_NAMES) >= _NAMES_KEPT:
            _NAMES.clear()
        type_at = HEAD.size + tenant_len
        names = _NAMES[raw] = (value[HEAD.size:type_at].decode(), value[type_at:body_at].decode())
    return RowMeta(enqueued, expires, dequeues, flags, nonce, names[0], names[1], body_at)


def nonce_of(value: bytes) -> bytes:
    return value[_NONCE_AT:_NONCE_END]


def expires_us(value: bytes) -> int:
    return _U64.unpack(value[_EXPIRES])[0]


def enqueued_us(value: bytes) -> int:
    return _U64.unpack(value[:8])[0]


def waiting_since_us(value: bytes, visible_us: int) -> int:
    """When the message of a visible row started to wait, in µs: when it became visible
    if never received (no nonce yet: its delay is the sender's choice, not a wait), else
    when it was enqueued (a redelivery, a retry's back-off or a deferral does not restart
    its age)."""
    return visible_us if nonce_of(value) == NO_NONCE else _U64.unpack(value[:8])[0]


def flags_of(value: bytes) -> int:
    return value[20]


def redelivered(value: bytes, dequeue_count: int, nonce: bytes) -> bytes:
    """The same row with a new dequeue count and nonce (the body is copied, not read)."""
    return b"".join((value[:16], DEQUEUE.pack(dequeue_count), value[20:21], nonce,
                     value[_NONCE_END:]))


def blob_ref(value: bytes, body_at: int) -> tuple[bytes, int, int]:
    """(blob id, size bytes, chunks) of a row whose body lives in the blobs table."""
    return BLOB_REF.unpack_from(value, body_at)
