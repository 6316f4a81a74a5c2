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

from collections.abc import Collection

from rayq.core.codec.model import (ALL_TENANTS, MAX_SUBQUEUE, US, Ending, check_count,
                                   check_name)
from rayq.core.kit.kv import Txn
from rayq.core.storage import layout
from rayq.core.storage.ledger import Env, Ledger
from rayq.errors import InvalidMessage, QueueDisabled, Throttled


def diverted(env: Env, sq: int, type_: str, tenant: str) -> str | None:
    """The flooder tenant (or "*") new messages of (type, tenant) belong to on this
    subqueue, else None."""
    for flood_type, flooder in env.diverts.get(sq, ()):
        if flood_type == type_ and flooder in (tenant, ALL_TENANTS):
            return flooder
    return None


class FlooderPuts:
    """What a shard does with a listed flooder's new messages (``FloodConfig.flooder_puts``):
    "spill" takes them all to the spill store; "throttle" takes up to ``rate_per_s`` a
    second per flooder (type, tenant or "*") on this shard, from a bucket of ``burst``
    messages, and refuses a put while its flooder's bucket is empty; "block" refuses
    every put of a flooder. The source text lists flooders so that other components
    "can throttle or block new incoming messages"; the flooder list used is the shard's
    own (its diverts), so no put waits on the network."""

    def __init__(self, mode: str = "spill", rate_per_s: float = 100.0, burst: int = 1000):
        self.mode, self.rate_per_s, self.burst = mode, float(rate_per_s), int(burst)
        self._buckets: dict[tuple[str, str], tuple[float, int]] = {}  # (tokens, at µs)

    @classmethod
    def of(cls, flood) -> "FlooderPuts":
        """The policy ``flood`` (a :class:`rayq.config.FloodConfig`) sets."""
        return cls(flood.flooder_puts, flood.flooder_rate_per_s, flood.flooder_burst)

    def admit(self, type_: str, flooder: str, count: int, now_us: int) -> None:
        """Let ``count`` new messages of flooder (``type_``, ``flooder``) through, or raise
        Throttled. A put is let through whole while the bucket is not empty, and its
        messages are taken from it, into debt if need be: a batch is never split, and
        the flooder's rate over time stays ``rate_per_s``."""
        if self.mode == "spill":
            return
        if self.mode == "block":
            raise Throttled(f"tenant {flooder!r} is listed as a flooder of type {type_!r}: "
                            "its new messages are refused while it is listed")
        tokens, at = self._buckets.get((type_, flooder), (float(self.burst), now_us))
        tokens = min(float(self.burst), tokens + (now_us - at) / US * self.rate_per_s)
        if tokens <= 0:
            self._buckets[(type_, flooder)] = (tokens, now_us)
            raise Throttled(
                f"tenant {flooder!r} is listed as a flooder of type {type_!r} and sends past "
                f"{self.rate_per_s:g} messages/s: retry in {-tokens / self.rate_per_s + 0.001:.3f}s"
                " or later")
        self._buckets[(type_, flooder)] = (tokens - count, now_us)

    def forget_others(self, listed: Collection[tuple[str, str]]) -> None:
        """Drop the buckets of flooders no longer listed (listed again: a full bucket)."""
        for pair in set(self._buckets) - set(listed):
            del self._buckets[pair]


def admit_flooders(env: Env, sq: int, flooder_of: list[str | None], types: list[str],
                   counts: list[int], now_us: int) -> None:
    """Check a put's flooders' messages against ``env.flooder_puts`` before anything is
    written: per attribute group ``flooder_of`` (None: not a flooder's), its type and
    its message count. Raises Throttled, refusing the whole put."""
    per_flooder: dict[tuple[str, str], int] = {}
    for flooder, type_, count in zip(flooder_of, types, counts):
        if flooder is not None and count:
            per_flooder[(type_, flooder)] = per_flooder.get((type_, flooder), 0) + count
    for (type_, flooder), count in per_flooder.items():
        env.flooder_puts.admit(type_, flooder, count, now_us)


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
