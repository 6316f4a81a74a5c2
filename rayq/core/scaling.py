"""Subqueue scaling decisions (seed 003), a pure function of observed load.

Scale up when a subqueue that takes puts is busy or throttled; scale down by
retiring one subqueue to ``NO_PUT`` once the queue has been idle for a while,
and drop a retired subqueue when it has drained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rayq.config import ScalingConfig
from rayq.core.model import SubqueueState


@dataclass(frozen=True)
class SubqueueLoad:
    """What the manager observed of one subqueue over the last interval."""

    id: int
    shard: int
    state: SubqueueState
    version: int
    count: int
    ops_per_s: float = 0.0
    throttled_per_s: float = 0.0


@dataclass(frozen=True)
class ScalingDecision:
    add_on_shard: int | None = None
    retire: int | None = None
    drop: tuple[int, ...] = ()


def least_loaded_shard(shard_depths: Mapping[int, int]) -> int:
    """The shard with the fewest messages (lowest index on ties)."""
    return min(shard_depths, key=lambda shard: (shard_depths[shard], shard))


def is_idle(loads: Sequence[SubqueueLoad], config: ScalingConfig) -> bool:
    return all(load.ops_per_s < config.idle_ops_per_s and not load.throttled_per_s
               for load in loads)


def decide(loads: Sequence[SubqueueLoad], shard_depths: Mapping[int, int], *,
           min_subqueues: int, idle_for_s: float, config: ScalingConfig) -> ScalingDecision:
    """What to change in one queue's subqueues now.

    ``idle_for_s`` is how long the whole queue has been idle (0 when busy).
    """
    drop = tuple(l.id for l in loads if l.state is SubqueueState.NO_PUT and l.count == 0)
    open_ = [l for l in loads if l.state is SubqueueState.ALL]
    draining = any(l.state is SubqueueState.NO_PUT and l.count for l in loads)
    live = sum(1 for l in loads if l.state is not SubqueueState.DISABLED) - len(drop)
    busy = any(l.ops_per_s >= config.scale_up_ops_per_s
               or l.throttled_per_s >= config.scale_up_throttled_per_s for l in open_)
    if busy and live < config.max_subqueues:
        return ScalingDecision(add_on_shard=least_loaded_shard(shard_depths), drop=drop)
    if len(open_) > max(1, min_subqueues) and not draining and idle_for_s >= config.idle_s:
        retire = min(open_, key=lambda l: (l.count, -l.version))
        return ScalingDecision(retire=retire.id, drop=drop)
    return ScalingDecision(drop=drop)
