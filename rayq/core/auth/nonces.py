"""Seen nonces, kept durable: a replay window that survives a restart.

A verifier remembers every signed request's nonce for twice the allowed clock
skew (:class:`~rayq.core.auth.accounts.Verifier`). That memory alone dies with the
process, so a request captured before a restart could be replayed once after it.
Here each nonce is also written to the ``nonces`` table: a shard writes it in
the same transaction as the request it signs (its group commit), other actors
in a transaction of their own before they act. On open the table is read back
into the verifier.

Keys are (signature timestamp µs, 64-bit digest of account and nonce), big-endian,
so the entries too old to matter are a prefix of the table, deleted by range.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from rayq.core.auth.accounts import MAX_SKEW_S, Signature, nonce_digest
from rayq.core.kit.kv import KV, Txn
from rayq.core.codec.model import to_us

TABLE = "nonces"
WINDOW_S = 2 * MAX_SKEW_S  # kept this long past its timestamp: as the verifier keeps it
_KEY = struct.Struct(">QQ")
EXPIRE_PER_WRITE = 64  # expired entries deleted per remembering write: keeps up, stays small


def nonce_key(sig: Signature) -> bytes:
    """The table key of a verified request's nonce (its timestamp is within the skew)."""
    return _KEY.pack(max(0, to_us(sig.timestamp)), nonce_digest(sig.account, sig.nonce))


def remember(txn: Txn, keys: Iterable[bytes], now: float, window_s: float = WINDOW_S,
             expire_limit: int = EXPIRE_PER_WRITE) -> None:
    """Write ``keys`` in ``txn``; delete up to ``expire_limit`` entries older than the window."""
    for key in keys:
        txn.put(TABLE, key, b"")
    _expire(txn, now - window_s, expire_limit)


def _expire(txn: Txn, cutoff: float, limit: int | None) -> int:
    stop = _KEY.pack(max(0, to_us(cutoff)), 0)
    old = [key for key, _ in _take(txn.scan(TABLE, b"", stop), limit)]
    for key in old:
        txn.delete(TABLE, key)
    return len(old)


def _take(items, limit: int | None):
    for n, item in enumerate(items):
        if limit is not None and n >= limit:
            return
        yield item


def load(kv: KV, now: float, window_s: float = WINDOW_S) -> list[int]:
    """Digests of the nonces seen within the window (what a verifier must still refuse);
    older entries are deleted on the way."""
    def read(txn: Txn) -> list[int]:
        _expire(txn, now - window_s, None)
        return [_KEY.unpack(key)[1] for key, _ in txn.scan(TABLE, b"")]
    return kv.transact(read)
