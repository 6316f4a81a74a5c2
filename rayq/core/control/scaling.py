"""Scaling decisions (docs/autoscaling.md), pure functions of observed load: a queue's
subqueues, and the consumer actors.

Scale up when a subqueue that takes puts is busy or throttled. Scale down per
subqueue, as the source text does: a subqueue is *quiet* when it is seldom throttled
and small (few messages) or fast (its operation rate is far below what one
subqueue takes, or under ``idle_ops_per_s``). An operation is a request the subqueue
serves, a put or a receive, whatever its batch: a subqueue is a transaction stream,
whose cost is per request far more than per message. Once every open subqueue has been
quiet for ``idle_s`` and the others have room for its load, the quietest is
retired to ``NO_PUT``; a retired subqueue is dropped when it has drained. A
queue that grew under a burst so narrows again under moderate steady load.

Consumer actors follow the task backlog (:func:`wanted_consumers`): up at once to
one consumer per ``max_load`` tasks waiting or running, at most ``max_count``; down
to ``min_count`` once the backlog has been empty for ``scale_down_idle_s``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rayq.config import ConsumerConfig, ScalingConfig
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
    """``add_on_shard``: the shard a new subqueue goes to; ``new_shard``: that shard is
    to be started first (the next index: every shard carries one of the queue's)."""

    add_on_shard: int | None = None
    retire: int | None = None
    drop: tuple[int, ...] = ()
    new_shard: bool = False


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
           config: ScalingConfig, shard_nodes: Mapping[int, str] | None = None,
           max_shards: int = 0) -> ScalingDecision:
    """What to change in one queue's subqueues now.

    ``quiet_for_s``: per subqueue, how long it has been quiet (see :func:`is_quiet`;
    missing or 0 when it is not). ``shard_nodes``: each shard's leader's node, so an
    added subqueue lands on a shard, and a node, the queue does not use yet.
    ``max_shards``: while fewer shards run (``shard_depths`` has one entry a shard), a
    subqueue added when every shard carries one of the queue's goes to a new shard.
    """
    drop = tuple(l.id for l in loads if l.state is SubqueueState.NO_PUT and l.count == 0)
    open_ = [l for l in loads if l.state is SubqueueState.ALL]
    draining = any(l.state is SubqueueState.NO_PUT and l.count for l in loads)
    live = sum(1 for l in loads if l.state is not SubqueueState.DISABLED) - len(drop)
    busy = any(l.ops_per_s >= config.scale_up_ops_per_s
               or l.throttled_per_s >= config.scale_up_throttled_per_s for l in open_)
    if busy and live < config.max_subqueues:
        used = tuple(l.shard for l in loads if l.state is not SubqueueState.DISABLED)
        if wants_new_shard(used, shard_depths, max_shards):
            return ScalingDecision(add_on_shard=next_shard(shard_depths), drop=drop,
                                   new_shard=True)
        return ScalingDecision(add_on_shard=least_loaded_shard(shard_depths, used, shard_nodes),
                               drop=drop)
    settled = all(quiet_for_s.get(l.id, 0.0) >= config.idle_s for l in open_)
    if len(open_) > max(1, min_subqueues) and not draining and settled \
            and has_room_without_one(open_, config):
        retire = min(open_, key=lambda l: (l.count, l.ops_per_s, -l.version))
        return ScalingDecision(retire=retire.id, drop=drop)
    return ScalingDecision(drop=drop)


def wants_new_shard(used: Sequence[int], shard_depths: Mapping[int, int], max_shards: int) -> bool:
    """Whether a subqueue added to a queue with subqueues on ``used`` shards goes to a new
    shard: every shard carries one already (another would add no writer), and fewer than
    ``max_shards`` run."""
    return len(shard_depths) < max_shards and set(shard_depths) <= set(used)


def next_shard(shard_depths: Mapping[int, int]) -> int:
    """The index of the next shard added (shards are numbered from 0 without gaps)."""
    return max(shard_depths, default=-1) + 1


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


# -- consumer actors (docs/autoscaling.md#consumers-follow-the-backlog) ------------------
@dataclass(frozen=True)
class ConsumerRule:
    """How many consumer actors run for a task backlog.

    ``min_count``/``max_count``: the bounds (actors); ``max_load``: tasks one consumer
    runs at once at most; ``idle_s``: seconds the backlog stays empty before the count
    goes down; ``autoscaled``: False when the count is fixed (no bound configured).
    """

    min_count: int
    max_count: int
    max_load: int
    idle_s: float
    autoscaled: bool = True

    @classmethod
    def of(cls, config: ConsumerConfig) -> ConsumerRule:
        return cls(*config.bounds, config.max_load, config.scale_down_idle_s, config.autoscaled)


@dataclass(frozen=True)
class ConsumerScale:
    """The consumer actors wanted (``wanted``, regular ones: boosters come on top);
    ``pinned`` when ``scale_consumers(n)`` set the count and the rule leaves it
    alone; ``busy_at``: when the task backlog was last seen non-empty (seconds, on the
    clock ``now`` comes from)."""

    wanted: int
    busy_at: float
    pinned: bool = False


def consumers_for(backlog: int, rule: ConsumerRule) -> int:
    """Consumers that run ``backlog`` tasks at ``max_load`` each (rounded up), within
    the rule's bounds."""
    return min(max(-(-backlog // rule.max_load), rule.min_count), rule.max_count)


def wanted_consumers(backlog: int, current: int, *, busy_at: float, now: float,
                     rule: ConsumerRule) -> int:
    """The consumer count for ``backlog`` tasks (waiting, delayed or in flight) with
    ``current`` consumers wanted so far: up at once to what the backlog needs, at most
    ``max_count``; down to ``min_count`` only when the backlog is empty and has been
    since ``busy_at`` for ``idle_s`` (``busy_at``, ``now``: seconds, one clock). A
    ``current`` outside the bounds comes inside at once.

    Down only when empty: the backlog counts the tasks in flight, so a consumer
    stopped then cuts no task short (a stop waits for a consumer's tasks a while,
    not for ever)."""
    need = consumers_for(backlog, rule)
    held = min(max(current, rule.min_count), rule.max_count)
    if need >= held or (backlog == 0 and now - busy_at >= rule.idle_s):
        return need
    return held


def next_scale(scale: ConsumerScale, backlog: int, now: float,
               rule: ConsumerRule) -> ConsumerScale:
    """One round: ``scale`` after seeing ``backlog`` tasks at ``now`` (seconds). A
    pinned count, or a fixed one, stays; when the backlog was last busy is kept
    all the same, for when the rule takes over again."""
    wanted = scale.wanted
    if rule.autoscaled and not scale.pinned:
        wanted = wanted_consumers(backlog, wanted, busy_at=scale.busy_at, now=now, rule=rule)
    return ConsumerScale(wanted, now if backlog else scale.busy_at, scale.pinned)


def chosen_scale(scale: ConsumerScale, count: int | None) -> ConsumerScale:
    """``scale_consumers(count)``: a count is wanted from now on, pinned; None hands
    the count back to the rule (a fixed configuration keeps the count it has)."""
    if count is None:
        return replace(scale, pinned=False)
    return replace(scale, wanted=count, pinned=True)


def restored_scale(wanted: int | None, pinned: bool, *, rule: ConsumerRule,
                   now: float) -> ConsumerScale:
    """The scale a manager starts from: the persisted ``wanted`` and ``pinned``; never
    persisted, ``min_count``: a fixed count (both bounds are ``count``), or the fewest
    when following the backlog (work that waits brings more at the first round).
    Busy at ``now``: a manager that took over waits ``idle_s`` before it lowers a
    count it inherited."""
    return ConsumerScale(rule.min_count if wanted is None else wanted, now, pinned)


def task_backlog(queues: Iterable[QueueInfo | None], counts: Mapping[int, int]) -> int:
    """Tasks in the task ``queues`` (None: a queue gone meanwhile), from per-subqueue
    ``counts`` of every message stored: waiting, delayed (a retry's back-off too) and
    in flight."""
    return sum(counts.get(sq.id, 0) for queue in queues if queue is not None
               for sq in queue.subqueues)
