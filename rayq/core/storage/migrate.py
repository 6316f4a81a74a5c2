"""Opening a shard written by an older rayq: rows move to the current layout once.

Format 1 (rayq up to the data-plane rebuild) stored each row as a msgpack tuple
(id, tenant, type, enqueued_at µs, expires_at µs, dequeue count, nonce, inline
body or None, blob reference or None, task). Format 2 had the header of
:mod:`rayq.core.storage.layout` without the first receive time. Format 3 is
:mod:`rayq.core.storage.layout`. Rows and spilled messages are rewritten in the
transaction that opens the shard, so a shard is wholly in one format. Receipts
handed out before the upgrade stay valid: the nonce is kept.

An older row does not know when it was first received: one never received gets 0
(a receive sets it), one received before gets its enqueue time, the earliest its
first receive can have been, so it reads the same everywhere from then on.

A follower (:mod:`rayq.core.replication.replica`) holds the leader's rows as they were
when it was seeded; a leader migrates its own rows when it opens, but ships only the
writes made after that, headed by the shard's scalars (``row_format`` among them).
:func:`migrate_before` brings the follower's rows to that format in the same
transaction, before the leader's first write set in it is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgpack

from rayq.core.kit.kv import Txn, Write
from rayq.core.storage import layout as rows

_SPILL_HEAD_BYTES = rows.SPILL_HEAD.size  # the same in every format
_V2_NONCE_END = 29  # where format 2's header put the type and tenant lengths


def migrate_rows(txn: Txn) -> int:
    """Bring every row of the shard to the current format; returns how many changed."""
    found = txn.get("meta", rows.ROW_FORMAT)
    if found == rows.ROW_FORMAT_NOW:
        return 0
    upgrade = _UPGRADES.get(found, from_v1)  # no record: format 1 (or a new, empty store)
    changed = [(key, upgrade(value)) for key, value in txn.scan("rows", b"")]
    spilled = [(key, value[:_SPILL_HEAD_BYTES] + upgrade(value[_SPILL_HEAD_BYTES:]))
               for key, value in txn.scan("spill", b"")]
    txn.putmulti("rows", changed)
    txn.putmulti("spill", spilled)
    txn.put("meta", rows.ROW_FORMAT, rows.ROW_FORMAT_NOW)
    return len(changed) + len(spilled)


def migrate_before(txn: Txn, writes: Iterable[Write]) -> None:
    """On a follower, before ``writes`` are applied: when they set the row format to the
    current one and this copy's rows are in another, migrate them first."""
    for table, key, value in writes:
        if key == rows.ROW_FORMAT and table == "meta":
            if value == rows.ROW_FORMAT_NOW:
                migrate_rows(txn)
            return


def _first_received_us(enqueued_us: int, dequeue_count: int) -> int:
    return enqueued_us if dequeue_count else 0


def from_v1(v1: bytes) -> bytes:
    """A format-1 row value in the current format."""
    (_, tenant, type_, enqueued_us, expires_us, dequeue_count, nonce, body, blob,
     *rest) = msgpack.unpackb(v1, raw=False, use_list=False)
    flags = (rows.TASK if rest and rest[0] else 0) | (rows.BLOB if blob is not None else 0)
    head = rows.prefix(enqueued_us, expires_us, flags, tenant.encode(), type_.encode())
    head = rows.redelivered(head, dequeue_count, nonce or rows.NO_NONCE,
                            _first_received_us(enqueued_us, dequeue_count))
    return head + (rows.blob_ref_value(*blob) if blob is not None else body)


def from_v2(v2: bytes) -> bytes:
    """A format-2 row value in the current format: the first receive time goes in after
    the nonce; the rest (names and body) is copied."""
    first_us = _first_received_us(rows.enqueued_us(v2), rows.dequeue_count(v2))
    return v2[:_V2_NONCE_END] + rows.pack_u64(first_us) + v2[_V2_NONCE_END:]


_UPGRADES: dict[bytes | None, Callable[[bytes], bytes]] = {b"2": from_v2}
