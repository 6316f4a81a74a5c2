"""The spill store of a shard, and moving a flooder's messages (seed 001).

A flooder's new messages go to the ``spill`` table instead of the live queue:
durable like every write, but never cached and invisible to receives, so a
flood costs the shard disk, not memory or receive time. The sweeper moves
them back in batches, one transaction each, keeping their ids (task outcomes
still find their waiters) and their enqueue times. ``move_matching`` moves a
new flooder's visible messages to its dedicated subqueue.

Spill keys are (spill key id, seq), the key id naming the flooder's
(type, tenant); the value starts with the message's source subqueue, fairness
key id and first visible time.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING

from rayq.core.flood import ALL_TENANTS
from rayq.core.model import PREFIX, ROW_KEY, Ending, NewMessage, check_count, check_name, decode_row, encode_row, to_us
from rayq.errors import QueueDisabled

if TYPE_CHECKING:
    from rayq.core.batch import WriteBatch
    from rayq.core.store import ShardStore

SPILL_KEY = struct.Struct(">QQ")
SPILL_HEAD = struct.Struct(">IIQ")  # source subqueue, fairness key id, visible_at µs


def spill_name(type_: str, tenant: str) -> str:
    return f"\x00spill\x00{type_}\x00{tenant}"


def diverted(store: "ShardStore", sq: int, m: NewMessage) -> str | None:
    """The flooder tenant (or "*") a new message belongs to on this subqueue, else None."""
    flooders = store.diverts.get(sq)
    if not flooders:
        return None
    for type_, tenant in flooders:
        if type_ == m.type and tenant in (m.tenant, ALL_TENANTS):
            return tenant
    return None


def spill_one(batch: "WriteBatch", sq: int, m: NewMessage, flooder: str) -> str:
    seq, kid, row = batch.new_row(m)
    spill_kid = batch.key_id(spill_name(m.type, flooder), create=True)
    head = SPILL_HEAD.pack(sq, kid, batch.now_us + to_us(m.delay_s))
    batch.txn.put("spill", SPILL_KEY.pack(spill_kid, seq), head + encode_row(row))
    batch.tenant_deltas[("S", sq, m.type, m.tenant)] += 1
    batch.effects.append(("enqueue", (sq, m.type, m.tenant), batch.now_us / 1e6, row.id, m.key))
    batch.stats["spilled"] += 1
    return row.id


def sweep(batch: "WriteBatch", type_: str, tenant: str, target: int, limit: int) -> int:
    """Move up to ``limit`` spilled messages of (type, tenant) into subqueue ``target``;
    expired ones, and those of a cleared or deleted subqueue, are dropped instead.
    Returns how many moved. Raises QueueDisabled when ``target`` is being removed."""
    check_name(type_, "type"), check_name(tenant, "tenant")
    check_count(target, "target", 0, 2**32 - 2), check_count(limit, "limit", 1, 100_000)
    check_target(batch, target)
    spill_kid = batch.key_id(spill_name(type_, tenant), create=False)
    if spill_kid is None:
        return 0
    start, stop = SPILL_KEY.pack(spill_kid, 0), SPILL_KEY.pack(spill_kid + 1, 0)
    entries = list(itertools.islice(batch.txn.scan("spill", start, stop), limit))
    moved = 0
    for key, value in entries:
        source, kid, visible_us = SPILL_HEAD.unpack(value[:SPILL_HEAD.size])
        row = decode_row(value[SPILL_HEAD.size:])
        if source in batch.store.purging:  # cleared: it must never come back
            drop_spilled(batch, key, value, Ending.DELETED)
            continue
        if row.expires_at_us <= batch.now_us:
            drop_spilled(batch, key, value, Ending.EXPIRED)
            batch.stats["expired"] += 1
            continue
        batch.txn.delete("spill", key)
        batch.tenant_deltas[("S", source, row.type, row.tenant)] -= 1
        batch.insert(ROW_KEY.pack(target, kid, visible_us, SPILL_KEY.unpack(key)[1]), row)
        moved += 1
    batch.stats["swept"] += moved
    return moved


def any_spilled(txn, key_ids: dict[str, int], type_: str, tenant: str) -> bool:
    """Whether the spill store holds anything under flooder (type, tenant)."""
    kid = key_ids.get(spill_name(type_, tenant))
    if kid is None:
        return False
    start, stop = SPILL_KEY.pack(kid, 0), SPILL_KEY.pack(kid + 1, 0)
    return next(iter(txn.scan("spill", start, stop)), None) is not None


def drop_spilled(batch: "WriteBatch", key: bytes, value: bytes, ending: Ending) -> None:
    """Delete one spill entry for good; a task message ends with ``ending``."""
    source = SPILL_HEAD.unpack(value[:SPILL_HEAD.size])[0]
    row = decode_row(value[SPILL_HEAD.size:])
    batch.txn.delete("spill", key)
    batch.tenant_deltas[("S", source, row.type, row.tenant)] -= 1
    batch.drop_blob(row)
    if row.task:
        batch.record(row.id, ending)


def check_target(batch: "WriteBatch", target: int) -> None:
    """Nothing moves into a subqueue that is being removed (a stale layout)."""
    if target in batch.store.purging:
        raise QueueDisabled(f"subqueue {target} is being removed")


def move_matching(batch: "WriteBatch", source: int, target: int, type_: str, tenant: str,
                  limit: int, after: bytes | None = None) -> tuple[int, bytes | None]:
    """Move the visible messages of (type, tenant) from ``source`` to ``target``,
    looking at up to ``limit`` rows after ``after``. Returns (moved, where to go on
    from, or None when done). Hidden rows stay: their receivers hold receipts."""
    check_name(type_, "type"), check_name(tenant, "tenant")
    check_count(source, "source", 0, 2**32 - 2), check_count(target, "target", 0, 2**32 - 2)
    check_count(limit, "limit", 1, 100_000)
    check_target(batch, target)
    if source in batch.store.purging:  # cleared since the caller looked: nothing to save
        return 0, None
    start = after + b"\x00" if after else PREFIX.pack(source, 0)
    rows = list(itertools.islice(batch.txn.scan("rows", start, PREFIX.pack(source + 1, 0)), limit))
    moved = 0
    for row_key, value in rows:
        sq, kid, visible_us, seq = ROW_KEY.unpack(row_key)
        row = decode_row(value)
        if visible_us > batch.now_us or row.type != type_ or tenant not in (row.tenant, ALL_TENANTS):
            continue
        batch.move_row(row_key, row, ROW_KEY.pack(target, kid, visible_us, seq))
        moved += 1
    done = len(rows) < limit
    return moved, None if done else rows[-1][0]
