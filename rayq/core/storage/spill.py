"""The spill store of a shard, and moving a flooder's messages (docs/flood-detection.md).

A flooder's new messages go to the ``spill`` table instead of the live queue:
durable like every write, but never cached and invisible to receives, so a
flood costs the shard disk, not memory or receive time. The sweeper moves
them back in batches, one transaction each, keeping their ids (task outcomes
still find their waiters) and their enqueue times. ``move_matching`` moves a
new flooder's visible messages to its dedicated subqueue. Which (type, tenant)
are diverted is the caller's policy (:attr:`Env.diverts`); the spill entry's
bytes are :mod:`rayq.core.storage.layout`'s.
"""

from __future__ import annotations

import itertools

from rayq.core.codec.model import ALL_TENANTS, MAX_SUBQUEUE, Ending, check_count, check_name
from rayq.core.kit.kv import Txn
from rayq.core.storage import layout
from rayq.core.storage.ledger import Env, Ledger
from rayq.errors import InvalidMessage, QueueDisabled


def diverted(env: Env, sq: int, type_: str, tenant: str) -> str | None:
    """The flooder tenant (or "*") new messages of (type, tenant) belong to on this
    subqueue, else None."""
    for flood_type, flooder in env.diverts.get(sq, ()):
        if flood_type == type_ and flooder in (tenant, ALL_TENANTS):
            return flooder
    return None


def spill_one(w: Ledger, sq: int, kid: int, visible_us: int, type_: str, tenant: str,
              flooder: str, seq: int, value: bytes) -> None:
    """Write one new message bound for subqueue ``sq`` to the spill store, under
    flooder (type, ``flooder``)."""
    spill_kid = w.key_id(layout.spill_name(type_, flooder), create=True)
    w.txn.put("spill", layout.spill_key(spill_kid, seq), layout.spill_value(sq, kid, visible_us, value))
    w.count_spilled(sq, type_, tenant, +1)
    w.stats["spilled"] += 1


def sweep(w: Ledger, env: Env, type_: str, tenant: str, target: int, limit: int) -> int:
    """Move up to ``limit`` spilled messages of (type, tenant) into subqueue ``target``;
    expired ones, and those of a cleared or deleted subqueue, are dropped instead.
    Returns how many moved. Raises QueueDisabled when ``target`` is being removed."""
    check_name(type_, "type")
    check_name(tenant, "tenant")
    check_count(target, "target", 0, MAX_SUBQUEUE)
    check_count(limit, "limit", 1, 100_000)
    check_target(w, target)
    spill_kid = w.key_id(layout.spill_name(type_, tenant), create=False)
    if spill_kid is None:
        return 0
    entries = list(itertools.islice(w.txn.scan("spill", *layout.spill_range(spill_kid)), limit))
    moved = 0
    for key, stored in entries:
        entry = layout.parse_spilled(stored)
        meta = layout.meta(entry.value)
        if entry.source in w.index.purging:  # cleared: it must never come back
            drop_spilled(w, key, stored, Ending.DELETED)
            continue
        if meta.expires_us <= w.now_us:
            drop_spilled(w, key, stored, Ending.EXPIRED)
            w.stats["expired"] += 1
            continue
        w.txn.delete("spill", key)
        w.count_spilled(entry.source, meta.type, meta.tenant, -1)
        w.insert(w.placed_key(target, entry.kid, entry.visible_us, layout.spill_seq(key),
                              meta.flags), entry.value, meta)
        moved += 1
    w.stats["swept"] += moved
    return moved


def move_matching(w: Ledger, env: Env, source: int, target: int, type_: str, tenant: str,
                  limit: int, after: bytes | None = None) -> tuple[int, bytes | None]:
    """Move the visible messages of (type, tenant) from ``source`` to ``target``,
    looking at up to ``limit`` rows after ``after``. Returns (moved, where to go on
    from, or None when done). Hidden rows stay: their receivers hold receipts."""
    check_name(type_, "type")
    check_name(tenant, "tenant")
    check_count(source, "source", 0, MAX_SUBQUEUE)
    check_count(target, "target", 0, MAX_SUBQUEUE)
    check_count(limit, "limit", 1, 100_000)
    if after is not None and (not isinstance(after, bytes) or len(after) != layout.ROW_KEY.size):
        raise InvalidMessage("after must be None or a row key that move_matching returned")
    check_target(w, target)
    if source in w.index.purging:  # cleared since the caller looked: nothing to save
        return 0, None
    start, stop = layout.subqueue_range(source)
    start = layout.key_after(after) if after else start
    found = list(itertools.islice(w.txn.scan("rows", start, stop), limit))
    moved = 0
    for row_key, value in found:
        visible_us = layout.visible_since(layout.parse_row_key(row_key)[2], w.now_us)
        meta = layout.meta(value)
        if visible_us > w.now_us or meta.type != type_ \
                or tenant not in (meta.tenant, ALL_TENANTS):
            continue
        w.move_to(row_key, value, target, visible_us, used=False)
        w.stats["moved"] += 1
        moved += 1
    done = len(found) < limit
    return moved, None if done else found[-1][0]


def drop_spilled(w: Ledger, key: bytes, stored: bytes, ending: Ending) -> None:
    """Delete one spill entry for good; a task message ends with ``ending``."""
    entry = layout.parse_spilled(stored)
    meta = layout.meta(entry.value)
    w.txn.delete("spill", key)
    w.count_spilled(entry.source, meta.type, meta.tenant, -1)
    if meta.flags & layout.BLOB:
        w.drop_blob(entry.value, meta)
    if meta.flags & layout.TASK:
        w.record(layout.spill_seq(key), ending, value=entry.value)


def check_target(w: Ledger, target: int) -> None:
    """Nothing moves into a subqueue that is being removed (a stale layout)."""
    if target in w.index.purging:
        raise QueueDisabled(f"subqueue {target} is being removed")


def any_spilled(txn: Txn, key_ids: dict[str, int], type_: str, tenant: str) -> bool:
    """Whether the spill store holds anything under flooder (type, tenant)."""
    kid = key_ids.get(layout.spill_name(type_, tenant))
    if kid is None:
        return False
    return next(iter(txn.scan_keys("spill", *layout.spill_range(kid))), None) is not None
