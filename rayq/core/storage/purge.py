"""Removing cleared and deleted subqueues in the background
(docs/visibility-and-receipts.md).

Clearing a queue marks its subqueues "to be deleted" and starts fresh ones; a
background collector then removes the old rows. Here a shard keeps the marked
subqueues in its ``meta`` table (``purge:<id>``), so a restarted shard goes on
where it stopped. A marked subqueue is ``DISABLED`` in the same transaction:
nothing of it is delivered, peeked or counted again, and nothing new lands in
it. The collector then removes its rows, and the spilled messages it sent to
the spill store (docs/flood-detection.md), a bounded number per transaction, so other calls
on the shard never wait behind a long one.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable

from rayq.core.codec.model import Ending, SubqueueState, check_subqueue
from rayq.core.kit.kv import Txn
from rayq.core.storage import layout
from rayq.core.storage.ledger import Env, Ledger, ShardIndex
from rayq.core.storage.spill import drop_spilled

_CLEAR_CHUNK = 10_000


def mark(txn: Txn, subqueues: Iterable[int]) -> None:
    """Mark subqueues for removal and disable them, in the caller's transaction."""
    for sq in subqueues:
        txn.put("meta", layout.meta_key(layout.PURGE, sq), b"")
        txn.put("meta", layout.meta_key(layout.STATE, sq), SubqueueState.DISABLED.value.encode())


def remove_rows(w: Ledger, sq: int, limit: int) -> int:
    """Remove up to ``limit`` rows of subqueue ``sq`` (tasks among them end as Deleted)."""
    found = list(itertools.islice(w.txn.scan("rows", *layout.subqueue_range(sq)), limit))
    for row_key, value in found:
        w.remove(row_key, value, Ending.DELETED)
    return len(found)


def remove_spilled(w: Ledger, sources: Collection[int], limit: int,
                   after: bytes | None = None) -> tuple[int, bytes | None]:
    """Remove the spilled messages whose source subqueue is in ``sources``, looking at
    up to ``limit`` spill entries after ``after``. Returns (removed, where to go on
    from, or None when the whole spill table was looked at)."""
    start = layout.key_after(after) if after else b""
    entries = list(itertools.islice(w.txn.scan("spill", start), limit))
    removed = 0
    for key, value in entries:
        if layout.spill_source(value) in sources:
            drop_spilled(w, key, value, Ending.DELETED)
            removed += 1
    return removed, (entries[-1][0] if len(entries) == limit else None)


def finished(index: ShardIndex, subqueues: Collection[int]) -> list[int]:
    """Marked subqueues with neither rows nor spilled messages left."""
    return [sq for sq in subqueues if not index.stored_count(sq)]


def unmark(txn: Txn, subqueues: Iterable[int]) -> None:
    for sq in subqueues:
        txn.delete("meta", layout.meta_key(layout.PURGE, sq))


def purge_step(w: Ledger, env: Env, done: Collection[int], limit: int,
               after: bytes | None) -> tuple[int, bytes | None]:
    """One bounded step of background removal: unmark the subqueues ``done``, then
    remove up to ``limit`` rows of the others and look at up to ``limit`` spill
    entries after ``after``. Returns (messages removed, where the spill scan goes on)."""
    unmark(w.txn, done)
    left = sorted(w.index.purging - set(done))
    removed = 0
    for sq in left:
        removed += remove_rows(w, sq, limit - removed)
        if removed >= limit:
            return removed, after
    if any(w.index.spilled.get(sq) for sq in left):
        n, after = remove_spilled(w, set(left), limit, after)
        removed += n
    return removed, after


def clear(w: Ledger, env: Env, subqueue: int) -> int:
    """Delete every message of a subqueue, spilled ones too, in this transaction;
    returns how many. The small, synchronous path: queues clear through a purge."""
    check_subqueue(subqueue)
    removed = 0
    while True:
        n = remove_rows(w, subqueue, _CLEAR_CHUNK)
        removed += n
        if n < _CLEAR_CHUNK:
            break
    after = None
    while True:  # the whole spill table
        n, after = remove_spilled(w, {subqueue}, _CLEAR_CHUNK, after)
        removed += n
        if after is None:
            return removed
