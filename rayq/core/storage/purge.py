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
import struct
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from rayq.core.codec.model import PREFIX, Ending, SubqueueState
from rayq.core.storage.spill import SPILL_HEAD

if TYPE_CHECKING:
    from rayq.core.storage.batch import WriteBatch
    from rayq.core.kit.kv import Txn

U64 = struct.Struct(">Q")
MARK = b"purge:"


def load_marks(txn: "Txn") -> set[int]:
    """The subqueues a shard was removing when it last stopped."""
    return {U64.unpack(key[len(MARK):])[0] for key, _ in txn.scan("meta", MARK, MARK[:-1] + b";")}


def mark(txn: "Txn", subqueues: Iterable[int]) -> None:
    """Mark subqueues for removal and disable them, in the caller's transaction."""
    for sq in subqueues:
        txn.put("meta", MARK + U64.pack(sq), b"")
        txn.put("meta", b"state:" + U64.pack(sq), SubqueueState.DISABLED.value.encode())


def remove_rows(batch: "WriteBatch", sq: int, limit: int) -> int:
    """Remove up to ``limit`` rows of subqueue ``sq`` (tasks among them end as Deleted)."""
    rows = list(itertools.islice(batch.txn.scan("rows", PREFIX.pack(sq, 0),
                                                PREFIX.pack(sq + 1, 0)), limit))
    for row_key, value in rows:
        batch._remove(row_key, value, Ending.DELETED)
    return len(rows)


def remove_spilled(batch: "WriteBatch", sources: Collection[int], limit: int,
                   after: bytes | None = None) -> tuple[int, bytes | None]:
    """Remove the spilled messages whose source subqueue is in ``sources``, looking at
    up to ``limit`` spill entries after ``after``. Returns (removed, where to go on
    from, or None when the whole spill table was looked at)."""
    start = after + b"\x00" if after else b""
    entries = list(itertools.islice(batch.txn.scan("spill", start), limit))
    removed = 0
    for key, value in entries:
        if SPILL_HEAD.unpack(value[:SPILL_HEAD.size])[0] in sources:
            batch.drop_spilled(key, value, Ending.DELETED)
            removed += 1
    return removed, (entries[-1][0] if len(entries) == limit else None)


def finished(store, subqueues: Collection[int]) -> list[int]:
    """Marked subqueues with neither rows nor spilled messages left."""
    return [sq for sq in subqueues if not store.stored_count(sq)]


def unmark(txn: "Txn", subqueues: Iterable[int]) -> None:
    for sq in subqueues:
        txn.delete("meta", MARK + U64.pack(sq))
