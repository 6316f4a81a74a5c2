"""Subqueue scaling decisions (docs/autoscaling.md), a pure function of observed load.

Scale up when a subqueue that takes puts is busy or throttled. Scale down per
subqueue, as the source text does: a subqueue is *quiet* when it is seldom throttled
and small (few messages) or fast (its operation rate is far below what one
subqueue takes, or under ``idle_ops_per_s``). Once every open subqueue has been
quiet for ``idle_s`` and the others have room for its load, the quietest is
retired to ``NO_PUT``; a retired subqueue is dropped when it has drained. A
queue that grew under a burst so narrows again under moderate steady load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayq.config import ScalingConfig
from rayq.core.codec.model import SubqueueState
from rayq.core.control.placement import least_loaded_shard

if TYPE_CHECKING:
    from rayq.core.control.registry import QueueInfo


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


def is_quiet(load: SubqueueLoad, config: ScalingConfig) -> bool:
    """Seldom throttled, and small or fast (docs/autoscaling.md: the three scale-down signals)."""
    if load.throttled_per_s >= config.seldom_throttled_per_s:
        return False
    small = load.count < config.small_count
    fast = load.ops_per_s < max(config.idle_ops_per_s,
                                config.fast_ops_fraction * config.scale_up_ops_per_s)
    return small or fast


def has_room_without_one(open_: Sequence[SubqueueLoad], config: ScalingConfig) -> bool:
    """The other open subqueues would stay fast with the retired one's operations."""
    if len(open_) < 2:
        return False
    per_subqueue = sum(l.ops_per_s for l in open_) / (len(open_) - 1)
    return per_subqueue < max(config.idle_ops_per_s,
                              config.fast_ops_fraction * config.scale_up_ops_per_s)


def decide(loads: Sequence[SubqueueLoad], shard_depths: Mapping[int, int], *,
           min_subqueues: int, quiet_for_s: Mapping[int, float],
           config: ScalingConfig, shard_nodes: Mapping[int, str] | None = None) -> ScalingDecision:
    """What to change in one queue's subqueues now.

    ``quiet_for_s``: per subqueue, how long it has been quiet (see :func:`is_quiet`;
    missing or 0 when it is not). ``shard_nodes``: each shard's leader's node, so an
    added subqueue lands on a shard, and a node, the queue does not use yet.
    """
    drop = tuple(l.id for l in loads if l.state is SubqueueState.NO_PUT and l.count == 0)
    open_ = [l for l in loads if l.state is SubqueueState.ALL]
    draining = any(l.state is SubqueueState.NO_PUT and l.count for l in loads)
    live = sum(1 for l in loads if l.state is not SubqueueState.DISABLED) - len(drop)
    busy = any(l.ops_per_s >= config.scale_up_ops_per_s
               or l.throttled_per_s >= config.scale_up_throttled_per_s for l in open_)
    if busy and live < config.max_subqueues:
        used = tuple(l.shard for l in loads if l.state is not SubqueueState.DISABLED)
        return ScalingDecision(add_on_shard=least_loaded_shard(shard_depths, used, shard_nodes),
                               drop=drop)
    settled = all(quiet_for_s.get(l.id, 0.0) >= config.idle_s for l in open_)
    if len(open_) > max(1, min_subqueues) and not draining and settled \
            and has_room_without_one(open_, config):
        retire = min(open_, key=lambda l: (l.count, l.ops_per_s, -l.version))
        return ScalingDecision(retire=retire.id, drop=drop)
    return ScalingDecision(drop=drop)


def loads_of(queue: QueueInfo, counts: Mapping[int, int], rates: "OpRates") -> list[SubqueueLoad]:
    """What scaling sees of ``queue``: its subqueues but the dedicated ones (the flood
    detector's), with their counts and operation rates."""
    return [SubqueueLoad(s.id, s.shard, s.state, s.version, counts.get(s.id, 0), *rates.of(s.id))
            for s in queue.subqueues if not s.dedicated]


class OpRates:
    """Operations and throttled calls per second of each subqueue, from the running
    counters the shards report, between two readings (``now``: monotonic seconds)."""

    MIN_SPAN_S = 1e-3  # two readings closer than this count as this far apart

    def __init__(self):
        self._last: dict[int, tuple[float, int, int]] = {}  # subqueue -> (at, ops, throttled)
        self._rates: dict[int, tuple[float, float]] = {}

    def observe(self, ops: Mapping[int, int], throttled: Mapping[int, int], now: float) -> None:
        """One shard's counters now; a subqueue's first reading has rate 0."""
        for sq in set(ops) | set(throttled):
            count, thr = ops.get(sq, 0), throttled.get(sq, 0)
            then, count0, thr0 = self._last.get(sq, (now, count, thr))
            span = max(now - then, self.MIN_SPAN_S)
            self._rates[sq] = ((count - count0) / span, (thr - thr0) / span)
            self._last[sq] = (now, count, thr)

    def of(self, sq: int) -> tuple[float, float]:
        """(operations per second, throttled calls per second); zeros if never read."""
        return self._rates.get(sq, (0.0, 0.0))


class QuietTracker:
    """Since when each subqueue has been quiet (:func:`is_quiet`), on the clock ``now``
    comes from."""

    def __init__(self, config: ScalingConfig):
        self.config = config
        self._since: dict[int, float] = {}

    def quiet_for(self, loads: Sequence[SubqueueLoad], now: float) -> dict[int, float]:
        """Seconds each quiet subqueue of ``loads`` has been quiet; a busy one starts over."""
        out = {}
        for load in loads:
            if is_quiet(load, self.config):
                out[load.id] = now - self._since.setdefault(load.id, now)
            else:
                self._since.pop(load.id, None)
        return out

    def restart(self, subqueues: Sequence[int]) -> None:
        """These must be quiet for ``idle_s`` again (one of their queue just retired)."""
        for sq in subqueues:
            self._since.pop(sq, None)
