"""One consumer's state: its balancer, counters, handlers, plan and reports
(docs/consumer-balancing.md).

:class:`ConsumerState` is what ``actors/consumer.py`` keeps between calls; the
actor holds only handles (shards, manager, threads, pollers) and does the calls
this state decides. Time comes from an injected :class:`~rayq.core.kit.clock.Clock`,
so a test drives a consumer's bookkeeping on a fake clock
(:class:`rayq.testing.SimulatedLongPolls` runs several on one queue).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rayq.config import Config
from rayq.core.codec.model import StoredMessage
from rayq.core.codec.tasks import DeferralCause, Outcome, TaskSpec, UsageReport
from rayq.core.consumers.balancer import BalancerState, is_hit
from rayq.core.consumers.decisions import (Launch, PlanFollower, Saturation, effective_load,
                                           excluded_keys, held_back, poll_places, receive_size,
                                           recent_task_s, refreshed_handlers, slots_to_start,
                                           Unloadable)
from rayq.core.control.registry import QueueInfo
from rayq.core.fairness.policy import ListenPlan
from rayq.core.kit.clock import Clock

Handler = tuple[TaskSpec, Any, bytes]  # (spec, loaded function, pickled function)


@dataclass(frozen=True)
class ConsumerStats:
    """One consumer's balancer state and counters since it started (its finished
    tasks go to the coordinator as usage reports: see ``client.task_stats()``).

    polls: receive calls; hits: those that returned a task; waited_hits: hits that
    came only after a long-poll wait past ``hit_wait_s``, which the balancer counts as
    misses (docs/consumer-balancing.md); deferrals: tasks put back unrun (a
    concurrency limit, host pressure, a suspended key, no handler: see
    ``DeferralCause``); lost: tasks whose receipt went stale before they were ended
    (someone else re-ran them); unloadable: the task types whose handler this consumer
    could not load, with the error (their tasks are dead-lettered with it; every other
    type runs); plan_orders: receives that asked for keys in the coordinator's order (0
    while interventions are passive or off on this consumer's node).
    """

    index: int
    load: int
    hit_rate: float
    polls: int
    hits: int
    running: int
    deferrals: int
    lost: int
    background_failures: int = 0  # failed plan/handler refreshes and receives, logged each
    plan_version: int | None = None  # the coordinator's listen plan this consumer follows
    waited_hits: int = 0
    unloadable: dict[str, str] = field(default_factory=dict)
    plan_orders: int = 0

    @property
    def empty_polls(self) -> int:
        return self.polls - self.hits


class ConsumerState:
    """A consumer's bookkeeping: every count and decision of ``actors/consumer.py``,
    none of its calls."""

    def __init__(self, index: int, config: Config, clock: Clock,
                 rng: random.Random | None = None):
        self.index, self.config, self.clock = index, config, clock
        self.consumer_config = config.consumers
        self.balancer = BalancerState.initial(self.consumer_config)
        self.handlers: dict[str, Handler] = {}
        self.tasks_version: int | None = None
        self.plan = PlanFollower(index, rng or random.Random(index))
        self.saturation = Saturation(self.consumer_config.defer_s)  # on the monotonic clock
        self.pressed = False    # the host over its memory or CPU limit (read every adjust)
        self.fixed: int | None = None
        self.stopping = False
        self.polls = self.hits = self.waited_hits = 0
        self.deferrals = self.lost = self.running = 0
        self.held = 0      # tasks received and not yet ended
        self.claimed = 0   # tasks asked for by receives under way
        self.task_s: float | None = None  # recent mean handler time
        self._rotation = itertools.count()

    # -- the load ------------------------------------------------------------------
    @property
    def load(self) -> int:
        """How many pollers run now: a pinned load (benchmarks), else the balancer's."""
        return effective_load(self.fixed, self.balancer.load)

    def pin(self, load: int | None) -> None:
        """Pin the load (no balancing), or None to balance again."""
        self.fixed = load

    def stop(self) -> None:
        """Pollers stop receiving; tasks they hold run to their end."""
        self.stopping = True

    def adjust(self, pressed: bool, running: Collection[int]) -> list[int]:
        """Close a balancing period: move the load by the period's hit rate, note
        whether the host is ``pressed``; returns the poller slots to start (those
        below the load not ``running``)."""
        self.balancer = self.balancer.adjusted(self.consumer_config)
        self.pressed = pressed
        return slots_to_start(self.load, running)

    # -- receiving -----------------------------------------------------------------
    def claim(self) -> int:
        """How many tasks the next receive asks for (0: wait for a task to end); a
        claim stands until :meth:`received` or :meth:`receive_failed`."""
        want = receive_size(self.load, self.held, self.claimed, self.consumer_config.prefetch,
                            self.task_s)
        self.claimed += want
        return want

    def received(self, want: int, got: int, waited_s: float) -> None:
        """A receive claimed ``want`` and got ``got`` tasks after a long-poll wait of
        ``waited_s`` seconds (0 when a non-blocking look found them)."""
        self.claimed -= want
        hit = is_hit(got, waited_s, self.consumer_config)
        self.polls += 1
        self.hits += bool(got)
        self.waited_hits += bool(got) and not hit
        self.balancer = self.balancer.polled(hit)
        self.held += got

    def receive_failed(self, want: int) -> None:
        self.claimed -= want

    def places(self, routes: Sequence[tuple[QueueInfo, Sequence[int]]]
               ) -> list[tuple[QueueInfo, int]]:
        """Where this receive looks, starting one place further than the last one."""
        return poll_places(routes, next(self._rotation))

    def excluded(self) -> set[str]:
        """The keys receives leave out now: suspended keys and saturated types."""
        return excluded_keys(self.plan.suspended,
                             self.saturation.saturated(self.clock.monotonic()),
                             self.config.fairness.key)

    def listen_order(self, exclude: Collection[str]) -> list[str] | None:
        """The plan's key order for a non-blocking receive (None: the shard's)."""
        return self.plan.order(exclude)

    # -- handlers and plan -----------------------------------------------------------
    @property
    def queues(self) -> list[str]:
        """The queues the known handlers take tasks from, sorted."""
        return sorted({spec.queue for spec, *_ in self.handlers.values()})

    def adopt_handlers(self, version: int, table: Mapping[str, tuple[TaskSpec, bytes]] | None,
                       load: Callable[[bytes], Any], launch: Launch | None = None) -> None:
        """The manager's task ``table`` at ``version`` (None: unchanged); handlers are
        loaded with ``load``, or made Ray task launchers with ``launch``
        (:func:`~rayq.core.consumers.decisions.refreshed_handlers`)."""
        if table is not None:
            self.handlers = refreshed_handlers(self.handlers, table, load, launch)
            self.tasks_version = version

    def adopt_plan(self, plan: ListenPlan | None) -> None:
        self.plan.adopt(plan)

    # -- running -------------------------------------------------------------------
    def hold_back(self, has_handler: bool, key: str) -> DeferralCause | None:
        """Why a received task must not run now, if it must not."""
        return held_back(has_handler, key, self.plan.suspended, self.pressed)

    def saturate(self, type_: str) -> None:
        """``type_`` is at its concurrency limit: leave it out of receives a while."""
        self.saturation.saturate(type_, self.clock.monotonic())

    def started(self) -> float:
        """A handler starts; returns its start time (the clock's ``now``)."""
        self.running += 1
        return self.clock.now()

    def finished(self, started: float) -> float:
        """A handler that began at ``started`` returned or raised; its usage seconds."""
        self.running -= 1
        usage_s = self.clock.now() - started
        self.task_s = recent_task_s(self.task_s, usage_s)
        return usage_s

    def released(self) -> None:
        """A held task was ended (or lost): its place in the load is free."""
        self.held -= 1

    def deferred(self) -> None:
        self.deferrals += 1

    def lost_one(self) -> None:
        """A task's receipt went stale: someone else holds it now."""
        self.lost += 1

    def report(self, m: StoredMessage, queue: str, usage_s: float, outcome: Outcome,
               wait_s: float, cause: DeferralCause | None = None) -> UsageReport:
        """A delivery's usage report, which goes to its shard with the delivery's end (the
        coordinator takes it there); its usage is spent from the plan here."""
        self.plan.spend(m.key, usage_s)
        return UsageReport(m.key, m.tenant, m.type, usage_s, outcome, max(0.0, wait_s),
                           self.clock.now(), m.id, m.dequeue_count, queue, cause)

    def stats(self, background_failures: int = 0) -> ConsumerStats:
        return ConsumerStats(self.index, self.balancer.load, self.balancer.hit_rate,
                             self.polls, self.hits, self.running, self.deferrals, self.lost,
                             background_failures, self.plan.version, self.waited_hits,
                             self.unloadable(), self.plan.ordered)

    def unloadable(self) -> dict[str, str]:
        """The task types whose handler could not be loaded here, with the error."""
        return {type_: f"{fn.error_type}: {fn.message}"
                for type_, (_, fn, _) in sorted(self.handlers.items())
                if isinstance(fn, Unloadable)}
