"""The spill store of a shard, and moving a flooder's messages (docs/flood-detection.md).

A flooder's new messages go to the ``spill`` table instead of the live queue:
durable like every write, but never cached and invisible to receives, so a
flood costs the shard disk, not memory or receive time. The sweeper moves
them back in batches, one transaction each, keeping their ids (task outcomes
still find their waiters) and their enqueue times. ``move_matching`` moves a
new flooder's visible messages to its dedicated subqueue.

Spill keys are (spill key id, seq), the key id naming the flooder's
(type, tenant); the value is the message's source subqueue, fairness key id and
first visible time, then its row value as it will go back into the queue.
:class:`SpillOps` holds these operations; :class:`~rayq.core.storage.batch.WriteBatch`
has them as its own.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING

from rayq.core.storage import layout as rows
from rayq.core.flood.detection import ALL_TENANTS
from rayq.core.codec.model import MAX_SUBQUEUE, PREFIX, ROW_KEY, Ending, check_count, check_name
from rayq.errors import InvalidMessage, QueueDisabled

if TYPE_CHECKING:
    from rayq.core.storage.batch import WriteBatch, _Group
    from rayq.core.codec.wire import Attrs

SPILL_KEY = struct.Struct(">QQ")
SPILL_HEAD = struct.Struct(">IIQ")  # source subqueue, fairness key id, visible_at µs


def spill_name(type_: str, tenant: str) -> str:
    return f"\x00spill\x00{type_}\x00{tenant}"


class SpillOps:
    """Spilling, sweeping and moving flooders' messages, as operations of a write batch."""

    def diverted(self: "WriteBatch", sq: int, attrs: "Attrs") -> str | None:
        """The flooder tenant (or "*") new messages with ``attrs`` belong to on this
        subqueue, else None."""
        for type_, tenant in self.store.diverts.get(sq, ()):
            if type_ == attrs.type and tenant in (attrs.tenant, ALL_TENANTS):
                return tenant
        return None

    def spill_one(self: "WriteBatch", sq: int, group: "_Group", seq: int, value: bytes) -> None:
        """Write one new message of a diverted group, bound for subqueue ``sq``, to the
        spill store."""
        attrs = group.attrs
        spill_kid = self.key_id(spill_name(attrs.type, group.spill), create=True)
        head = SPILL_HEAD.pack(sq, group.kid, group.visible_us)
        self.txn.put("spill", SPILL_KEY.pack(spill_kid, seq), head + value)
        self.tenant_deltas[("S", sq, attrs.type, attrs.tenant)] += 1
        self.stats["spilled"] += 1

    def sweep(self: "WriteBatch", type_: str, tenant: str, target: int, limit: int) -> int:
        """Move up to ``limit`` spilled messages of (type, tenant) into subqueue ``target``;
        expired ones, and those of a cleared or deleted subqueue, are dropped instead.
        Returns how many moved. Raises QueueDisabled when ``target`` is being removed."""
        check_name(type_, "type")
        check_name(tenant, "tenant")
        check_count(target, "target", 0, MAX_SUBQUEUE)
        check_count(limit, "limit", 1, 100_000)
        self.check_target(target)
        spill_kid = self.key_id(spill_name(type_, tenant), create=False)
        if spill_kid is None:
            return 0
        start, stop = SPILL_KEY.pack(spill_kid, 0), SPILL_KEY.pack(spill_kid + 1, 0)
        entries = list(itertools.islice(self.txn.scan("spill", start, stop), limit))
        moved = 0
        for key, stored in entries:
            source, kid, visible_us = SPILL_HEAD.unpack_from(stored)
            value = stored[SPILL_HEAD.size:]
            meta = rows.meta(value)
            if source in self.store.purging:  # cleared: it must never come back
                self.drop_spilled(key, stored, Ending.DELETED)
                continue
            if meta.expires_us <= self.now_us:
                self.drop_spilled(key, stored, Ending.EXPIRED)
                self.stats["expired"] += 1
                continue
            self.txn.delete("spill", key)
            self.tenant_deltas[("S", source, meta.type, meta.tenant)] -= 1
            self.insert(ROW_KEY.pack(target, kid, visible_us, SPILL_KEY.unpack(key)[1]), value,
                        meta)
            moved += 1
        self.stats["swept"] += moved
        return moved

    def move_matching(self: "WriteBatch", source: int, target: int, type_: str, tenant: str,
                      limit: int, after: bytes | None = None) -> tuple[int, bytes | None]:
        """Move the visible messages of (type, tenant) from ``source`` to ``target``,
        looking at up to ``limit`` rows after ``after``. Returns (moved, where to go on
        from, or None when done). Hidden rows stay: their receivers hold receipts."""
        check_name(type_, "type")
        check_name(tenant, "tenant")
        check_count(source, "source", 0, MAX_SUBQUEUE)
        check_count(target, "target", 0, MAX_SUBQUEUE)
        check_count(limit, "limit", 1, 100_000)
        if after is not None and (not isinstance(after, bytes) or len(after) != ROW_KEY.size):
            raise InvalidMessage("after must be None or a row key that move_matching returned")
        self.check_target(target)
        if source in self.store.purging:  # cleared since the caller looked: nothing to save
            return 0, None
        start = after + b"\x00" if after else PREFIX.pack(source, 0)
        found = list(itertools.islice(self.txn.scan("rows", start, PREFIX.pack(source + 1, 0)),
                                      limit))
        moved = 0
        for row_key, value in found:
            sq, kid, visible_us, seq = ROW_KEY.unpack(row_key)
            meta = rows.meta(value)
            if visible_us > self.now_us or meta.type != type_ \
                    or tenant not in (meta.tenant, ALL_TENANTS):
                continue
            self.move_row(row_key, value, ROW_KEY.pack(target, kid, visible_us, seq))
            moved += 1
        done = len(found) < limit
        return moved, None if done else found[-1][0]

    def drop_spilled(self: "WriteBatch", key: bytes, stored: bytes, ending: Ending) -> None:
        """Delete one spill entry for good; a task message ends with ``ending``."""
        source = SPILL_HEAD.unpack_from(stored)[0]
        value = stored[SPILL_HEAD.size:]
        meta = rows.meta(value)
        self.txn.delete("spill", key)
        self.tenant_deltas[("S", source, meta.type, meta.tenant)] -= 1
        if meta.flags & rows.BLOB:
            self.drop_blob(value, meta)
        if meta.flags & rows.TASK:
            self.record(self.message_id(SPILL_KEY.unpack(key)[1]), ending)

    def check_target(self: "WriteBatch", target: int) -> None:
        """Nothing moves into a subqueue that is being removed (a stale layout)."""
        if target in self.store.purging:
            raise QueueDisabled(f"subqueue {target} is being removed")


def any_spilled(txn, key_ids: dict[str, int], type_: str, tenant: str) -> bool:
    """Whether the spill store holds anything under flooder (type, tenant)."""
    kid = key_ids.get(spill_name(type_, tenant))
    if kid is None:
        return False
    start, stop = SPILL_KEY.pack(kid, 0), SPILL_KEY.pack(kid + 1, 0)
    return next(iter(txn.scan("spill", start, stop)), None) is not None
