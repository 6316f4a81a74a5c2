"""Flood detection and removal (docs/flood-detection.md), pure functions of depths and counts.

A *flooder* is a (queue, type, tenant) combination, or (queue, type, "*") for a
whole job type. Its existing messages move to a dedicated subqueue, its new
ones go to a spill store that bypasses the cache, and a sweeper brings them
back while the shard is healthy. The rules:

- tenant-level: the message type's queue (every tenant of that type in the
  queue, live and dedicated subqueues) is deeper than ``depth_threshold``;
  then every tenant that enqueued more than ``enqueue_threshold`` of that type
  into that queue within the look-back is a flooder. A tenant whose own
  dedicated subqueue is deeper than ``depth_threshold`` stays one whatever
  it enqueued (only it can be responsible);
- type-level: the type's queue (every tenant, live and dedicated subqueues) is
  deeper than ``type_depth_threshold``, whatever each tenant enqueued: a type
  flooding across many small tenants, none of them over ``enqueue_threshold``;
- removal: the last sweep emptied the flooder's spill store (everything spilled
  before it went back) and its unprocessed messages (queue depth) plus what it
  enqueued since that sweep (spilled now) are under ``exit_dedicated`` (a
  tenant flooder with its own subqueue) or ``exit_shared`` (a type-level
  flooder, whose messages share subqueues).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from rayq.config import FloodConfig
from rayq.core.codec.model import ALL_TENANTS



@dataclass(frozen=True)
class Flooder:
    """An entry of the flooder list. ``spilled``: messages in spill stores now;
    ``swept_empty``: the last sweeper run moved back everything spilled before it."""

    queue: str
    type: str
    tenant: str
    since: float
    spilled: int = 0
    depth: int = 0
    swept_empty: bool = False

    @property
    def combination(self) -> tuple[str, str, str]:
        return (self.queue, self.type, self.tenant)

    @property
    def type_level(self) -> bool:
        return self.tenant == ALL_TENANTS

    def covers(self, type_: str, tenant: str) -> bool:
        return self.type == type_ and self.tenant in (tenant, ALL_TENANTS)


@dataclass(frozen=True)
class FloodView:
    """What the detector knows at one run, summed over shards.

    depth: messages per (queue, type, tenant) in live subqueues;
    dedicated_depth: the same on dedicated subqueues; enqueued: enqueues per
    (queue, type, tenant) over the look-back; spilled: per (queue, type, tenant).
    """

    depth: Mapping[tuple[str, str, str], int]
    dedicated_depth: Mapping[tuple[str, str, str], int]
    enqueued: Mapping[tuple[str, str, str], float]
    spilled: Mapping[tuple[str, str, str], int]

    def unprocessed(self, combo: tuple[str, str, str]) -> int:
        """Depth (live and dedicated) plus spilled, for a combination or a whole type."""
        queue, type_, tenant = combo
        total = 0
        for table in (self.depth, self.dedicated_depth, self.spilled):
            total += sum(n for (q, t, who), n in table.items()
                         if q == queue and t == type_ and tenant in (who, ALL_TENANTS))
        return total

    def spilled_of(self, combo: tuple[str, str, str]) -> int:
        queue, type_, tenant = combo
        return sum(n for (q, t, who), n in self.spilled.items()
                   if q == queue and t == type_ and tenant in (who, ALL_TENANTS))


@dataclass(frozen=True)
class FloodChanges:
    added: tuple[Flooder, ...]
    removed: tuple[Flooder, ...]
    kept: tuple[Flooder, ...]


def type_depths(view: FloodView) -> dict[tuple[str, str], int]:
    """Depth of each message type's queue: all its tenants, live and dedicated subqueues."""
    out: dict[tuple[str, str], int] = {}
    for table in (view.depth, view.dedicated_depth):
        for (queue, type_, _), n in table.items():
            out[(queue, type_)] = out.get((queue, type_), 0) + n
    return out


def tenant_flooders(view: FloodView, config: FloodConfig) -> set[tuple[str, str, str]]:
    """Tenants that enqueued too much of a type whose queue is too deep, and tenants
    whose own dedicated subqueue is too deep."""
    flooding = {queue_type for queue_type, depth in type_depths(view).items()
                if depth > config.depth_threshold}
    heavy = {combo for combo, n in view.enqueued.items()
             if combo[:2] in flooding and n > config.enqueue_threshold}
    alone = {combo for combo, n in view.dedicated_depth.items()
             if combo[2] != ALL_TENANTS and n > config.depth_threshold}
    return heavy | alone


def type_flooders(view: FloodView, config: FloodConfig) -> set[tuple[str, str, str]]:
    """Types whose queue (all tenants, live and dedicated subqueues) is deeper than
    the type depth threshold."""
    return {(q, t, ALL_TENANTS) for (q, t), depth in type_depths(view).items()
            if depth > config.type_depth_threshold}


def may_leave(flooder: Flooder, view: FloodView, config: FloodConfig) -> bool:
    """The last sweep emptied the spill store, and the queue depth plus the enqueues
    since that sweep (which all went to spill) are under the exit threshold."""
    limit = config.exit_shared if flooder.type_level else config.exit_dedicated
    return flooder.swept_empty and view.unprocessed(flooder.combination) < limit


def detect(view: FloodView, current: list[Flooder], config: FloodConfig,
           now: float) -> FloodChanges:
    """New flooders, flooders that may leave, and the others with fresh figures."""
    known = {f.combination: f for f in current}
    found = tenant_flooders(view, config) | type_flooders(view, config)
    added = tuple(Flooder(*combo, since=now, depth=view.unprocessed(combo))
                  for combo in sorted(found - set(known)))
    removed, kept = [], []
    for combo, flooder in known.items():
        fresh = replace(flooder, spilled=view.spilled_of(combo), depth=view.unprocessed(combo))
        if combo not in found and may_leave(fresh, view, config):
            removed.append(fresh)
        else:
            kept.append(fresh)
    return FloodChanges(added, tuple(removed), tuple(kept))


def shard_healthy(depth: int, under_pressure: bool, config: FloodConfig) -> bool:
    """The sweeper moves messages back only while this holds. ``depth``: of the queue
    it sweeps into (a deep unrelated queue on the same shard does not count);
    ``under_pressure``: the shard's memory."""
    return depth < config.healthy_depth and not under_pressure


def build_view(layout: Mapping[int, tuple[str, bool]], tenant_counts: list[Mapping],
               enqueue_counts: list[Mapping]) -> FloodView:
    """Sum the shards' counts into a :class:`FloodView`.

    layout: subqueue -> (queue name, dedicated?); tenant_counts: per shard,
    (kind, subqueue, type, tenant) -> n with kind "L" (live) or "S" (spilled);
    enqueue_counts: per shard, (subqueue, type, tenant) -> enqueues per window.
    Subqueues not in the layout (dead-letter queues, dropped ones) are left out.
    """
    depth: dict = {}
    dedicated: dict = {}
    spilled: dict = {}
    enqueued: dict = {}
    for counts in tenant_counts:
        for (kind, sq, type_, tenant), n in counts.items():
            if sq not in layout:
                continue
            queue, is_dedicated = layout[sq]
            table = spilled if kind == "S" else dedicated if is_dedicated else depth
            table[(queue, type_, tenant)] = table.get((queue, type_, tenant), 0) + n
    for counts in enqueue_counts:
        for (sq, type_, tenant), series in counts.items():
            if sq in layout:
                combo = (layout[sq][0], type_, tenant)
                enqueued[combo] = enqueued.get(combo, 0) + sum(series)
    return FloodView(depth, dedicated, enqueued, spilled)


def sweep_step(depth: int, under_pressure: bool, spilled: int, batches_done: int,
               config: FloodConfig, max_batches: int) -> str:
    """What the sweeper does next on one shard, checked before every batch:
    "sweep" a batch, "pause" (the target queue is deep or memory pressed: stop at once), "done"
    (nothing spilled) or "later" (this run's share of batches is used up)."""
    if spilled <= 0:
        return "done"
    if not shard_healthy(depth, under_pressure, config):
        return "pause"
    return "later" if batches_done >= max_batches else "sweep"
