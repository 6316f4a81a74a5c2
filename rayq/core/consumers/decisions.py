"""What a consumer decides, as functions of its state and ``now`` (the actor only
calls the shards and the manager with the answers).

- how a delivery ends: :func:`decide_end` (finish, retry later with back-off, or
  dead-letter on the last try), each end made by a write of the shard
  (:mod:`rayq.core.storage.writes`);
- whether a received task may run now: :func:`held_back`, :class:`Saturation`;
- how many tasks a receive asks for, and where it looks: :func:`receive_size`,
  :func:`poll_places`, :func:`long_poll_group`;
- which keys it asks for first: :class:`PlanFollower` (the coordinator's plan).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Union

from rayq.config import ConsumerConfig
from rayq.core.fairness.policy import ListenPlan, listen_order
from rayq.core.control.ray_tasks import ray_options
from rayq.core.control.registry import QueueInfo
from rayq.core.kit.retry import backoff_s
from rayq.core.codec.tasks import DeferralCause, Outcome, TaskSpec, encode_error, exception_name
from rayq.errors import TaskCancelled, TaskTimedOut
from rayq.core.storage import writes


# -- how a delivery ends ---------------------------------------------------------------
@dataclass(frozen=True)
class Finish:
    """The handler returned: record its result and delete the message."""

    outcome: ClassVar[Outcome] = Outcome.SUCCEEDED
    outcome_if_lost: ClassVar[Outcome] = Outcome.SUCCEEDED

    def write(self, receipt: str, result: bytes, dead_letter: int | None) -> writes.End:
        return writes.Finish(receipt, result)


@dataclass(frozen=True)
class Retry:
    """The handler raised and tries are left: the message reappears after ``delay_s``."""

    delay_s: float
    outcome: ClassVar[Outcome] = Outcome.FAILED
    outcome_if_lost: ClassVar[Outcome] = Outcome.FAILED

    def write(self, receipt: str, result: bytes, dead_letter: int | None) -> writes.End:
        return writes.ChangeVisibility(receipt, self.delay_s)


@dataclass(frozen=True)
class DeadLetter:
    """The handler raised on the last try: record the error, move the message to the
    dead-letter subqueue ``dead_letter`` (None: the queue has none, it is deleted)."""

    outcome: ClassVar[Outcome] = Outcome.DEAD
    outcome_if_lost: ClassVar[Outcome] = Outcome.FAILED  # someone else holds the last try

    def write(self, receipt: str, result: bytes, dead_letter: int | None) -> writes.End:
        return writes.Finish(receipt, result, dead_letter)


@dataclass(frozen=True)
class Deferral:
    """A task put back unrun for ``delay_s`` (see
    :class:`~rayq.core.codec.tasks.DeferralCause`): its report's outcome whoever made the
    end."""

    delay_s: float
    outcome: ClassVar[Outcome] = Outcome.DEFERRED
    outcome_if_lost: ClassVar[Outcome] = Outcome.DEFERRED

    def write(self, receipt: str, result: bytes, dead_letter: int | None) -> writes.End:
        return writes.Defer(receipt, self.delay_s)


@dataclass(frozen=True)
class Cancelled:
    """The task was cancelled while it ran and its handler stopped: the shard, which
    flagged it, records it cancelled in the end's transaction. No failure, not retried."""

    outcome: ClassVar[Outcome] = Outcome.CANCELLED
    outcome_if_lost: ClassVar[Outcome] = Outcome.CANCELLED

    def write(self, receipt: str, result: bytes, dead_letter: int | None) -> writes.End:
        return writes.Finish(receipt, result)


TaskEnd = Union[Finish, Retry, DeadLetter, Cancelled]


def is_last_try(attempt: int, task_max_receives: int, queue_max_receives: int | None) -> bool:
    """Delivery ``attempt`` (1 = the first) is the last: the task's own limit or the
    queue's, whichever comes first (the queue's also catches tasks whose consumers died)."""
    return attempt >= min(task_max_receives, queue_max_receives or task_max_receives)


def decide_end(succeeded: bool, attempt: int, spec: TaskSpec, queue_max_receives: int | None,
               config: ConsumerConfig, retriable: bool = True, draw: float = 1.0) -> TaskEnd:
    """How delivery ``attempt`` of a task ends: Finish when its handler returned,
    DeadLetter when it raised on the last try (or failed in a way another try would
    repeat, or its type's rule does not retry: not ``retriable``), else Retry after a
    back-off that doubles from the type's ``backoff_s`` (else ``config.retry_backoff_s``)
    with each delivery, up to its ``max_backoff_s`` (else ``config.max_backoff_s``).
    With the type's ``jitter``, the wait is drawn in the upper half of that back-off
    (``draw``: a uniform draw in [0, 1]; 1.0 waits it whole), so that tasks failing
    together do not all come back at once."""
    if succeeded:
        return Finish()
    if not retriable or is_last_try(attempt, spec.max_receives, queue_max_receives):
        return DeadLetter()
    first = config.retry_backoff_s if spec.backoff_s is None else spec.backoff_s
    most = config.max_backoff_s if spec.max_backoff_s is None else spec.max_backoff_s
    delay = backoff_s(attempt, first, most)
    return Retry(delay * (0.5 + 0.5 * draw) if spec.jitter else delay)


def may_retry(spec: TaskSpec, err: BaseException) -> bool:
    """Whether the handler's ``err`` may be retried under its type's rule: never when it
    is one of ``no_retry_on``; with ``retry_on`` set, only when it is one of those. A
    class counts for its bases too (``retry_on=(OSError,)`` retries ConnectionError)."""
    names = {exception_name(cls) for cls in type(err).__mro__}
    if names & set(spec.no_retry_on):
        return False
    return spec.retry_on is None or bool(names & set(spec.retry_on))


# -- cancel and time limits ----------------------------------------------------------------
class Stop(Enum):
    """Why a consumer stopped a running handler."""

    CANCELLED = "cancelled"  # client.cancel
    TIMED_OUT = "timed_out"  # past its time limit


def call_limit_s(spec: TaskSpec, options: dict) -> float | None:
    """The time limit of one call: its type's, or the lower one its submit gave
    (``options``: the call's, :func:`~rayq.core.codec.tasks.decode_call_options`)."""
    asked = options.get("time_limit_s")
    if not isinstance(asked, (int, float)) or isinstance(asked, bool) or asked <= 0:
        return spec.time_limit_s
    return asked if spec.time_limit_s is None else min(asked, spec.time_limit_s)


def stop_error(stop: Stop, limit_s: float | None) -> BaseException:
    """The error a stopped call ends with."""
    if stop is Stop.CANCELLED:
        return TaskCancelled()
    if limit_s is None:
        return TaskTimedOut()
    return TaskTimedOut("TaskTimedOut", f"the task ran past its time limit of {limit_s:g} s")


def stopped_end(stop: Stop, attempt: int, spec: TaskSpec, queue_max_receives: int | None,
                config: ConsumerConfig, draw: float = 1.0) -> TaskEnd:
    """How delivery ``attempt`` of a stopped call ends: Cancelled for a cancel; for a
    time limit, as any failure with TaskTimedOut (retried if its type's rule retries it
    and tries are left, else dead-lettered)."""
    if stop is Stop.CANCELLED:
        return Cancelled()
    retriable = may_retry(spec, stop_error(stop, spec.time_limit_s))
    return decide_end(False, attempt, spec, queue_max_receives, config, retriable, draw)


def forced_after_s(stop: Stop, grace_s: float) -> float:
    """How long after being told to stop a handler is stopped by force: a cancelled one
    has its type's ``cancel_grace_s`` to return; one past its time limit is stopped at
    once (its limit was its time)."""
    return grace_s if stop is Stop.CANCELLED else 0.0


STUCK_AFTER_S = 1.0  # the least a handler stopped by force is given to return


def stuck_after_s(grace_s: float) -> float:
    """How long after being stopped by force a handler that has not returned counts as
    stuck (its consumer restarts itself): its grace again, at least STUCK_AFTER_S."""
    return max(grace_s, STUCK_AFTER_S)


# -- whether a task may run now ----------------------------------------------------------
def held_back(has_handler: bool, key: str, suspended: Collection[str],
              host_pressed: bool) -> DeferralCause | None:
    """Why a received task must not run now, if it must not (checked before any lease)."""
    if not has_handler:
        return DeferralCause.CANNOT_RUN
    if key in suspended:
        return DeferralCause.SUSPENDED  # suspended after it was received
    if host_pressed:
        return DeferralCause.HOST_PRESSURE
    return None


def gives_up(cause: DeferralCause, enqueued_at: float, now: float,
             unrunnable_after_s: float) -> bool:
    """Whether a task held back for ``cause`` is dead-lettered rather than put back: one
    no handler was registered for within ``unrunnable_after_s`` of being sent (seconds
    of the clock ``now`` comes from) would otherwise come back every ``defer_s`` for ever."""
    return cause is DeferralCause.CANNOT_RUN and now - enqueued_at > unrunnable_after_s


def pause_after(cause: DeferralCause, defer_s: float) -> float:
    """How long a poller rests after putting a task back for ``cause``: ``defer_s``
    when its host is under pressure (the host needs a rest), else not at all."""
    return defer_s if cause is DeferralCause.HOST_PRESSURE else 0.0


class Saturation:
    """Job types found at their concurrency limit: a consumer leaves them out of its
    receives for ``defer_s`` (seconds of the clock ``now`` comes from)."""

    def __init__(self, defer_s: float):
        self.defer_s = defer_s
        self._until: dict[str, float] = {}

    def saturate(self, type_: str, now: float) -> None:
        self._until[type_] = now + self.defer_s

    def saturated(self, now: float) -> set[str]:
        return {type_ for type_, until in self._until.items() if until > now}


# -- what a receive asks for -------------------------------------------------------------
def effective_load(fixed: int | None, balanced: int) -> int:
    """The load a consumer runs at: a pinned one (benchmarks), else the balancer's."""
    return balanced if fixed is None else fixed


def slots_to_start(load: int, running: Collection[int]) -> list[int]:
    """The poller slots below ``load`` with no poller ``running`` (new, or one ended)."""
    return [slot for slot in range(load) if slot not in running]


SHORT_TASK_S = 0.02  # handlers this quick are batched by receives (see receive_size)
SHORT_BATCH_MAX = 32  # short tasks one poller holds at most (see short_batch)


TASK_TIME_WEIGHT = 0.2  # weight of the newest handler time in the recent mean


def recent_task_s(mean_s: float | None, latest_s: float) -> float:
    """The recent mean handler time, moved towards ``latest_s`` (the first one as is)."""
    if mean_s is None:
        return latest_s
    return mean_s + TASK_TIME_WEIGHT * (latest_s - mean_s)


def short_handlers(recent_task_s: float | None) -> bool:
    """Whether handlers of this recent mean time (None: none ran yet) are short: their
    tasks are received in batches."""
    return recent_task_s is not None and recent_task_s < SHORT_TASK_S


def short_batch(recent_task_s: float) -> int:
    """How many short tasks one poller holds: about SHORT_TASK_S of handler time, at
    least one and at most SHORT_BATCH_MAX."""
    return max(1, min(SHORT_BATCH_MAX, int(SHORT_TASK_S / max(recent_task_s, 1e-6))))


def receive_size(load: int, held: int, claimed: int, prefetch: int,
                 recent_task_s: float | None = None) -> int:
    """How many tasks the next receive asks for; 0: wait for tasks to end.

    Longer handlers (or none seen yet) are received ``prefetch`` at a time as soon as
    one of the ``load`` slots frees: there a receive is cheap beside the task, and a
    batch would start (and end) its tasks together, so a quiet tenant's task arriving
    meanwhile waits for the whole batch (fair dispatch's first-second promise:
    measured, quiet dwell p50 0.072 s with batches of the free load against 0.022 s
    one at a time, beside 200 ms noisy tasks).

    With short handlers (``recent_task_s``, their recent mean, under SHORT_TASK_S) each
    poller holds a batch of :func:`short_batch` tasks, about SHORT_TASK_S of work: a
    receive takes all the room the ``held`` tasks and those ``claimed`` by receives
    under way leave, and, while tasks run, waits until half of it is free. Receiving
    each slot as it freed made receives of one task, a commit each, and ends of one or
    two, which cost more than the tasks: tiny tasks ran at 1 400 a second on the
    2-core machine (a commit per task), and at 3 300 to 3 600 with these batches (a
    commit per ten)."""
    if not short_handlers(recent_task_s):
        room = load - held - claimed
        return min(room, prefetch) if room > 0 else 0
    capacity = load * short_batch(recent_task_s)
    room = capacity - held - claimed
    if room <= 0 or (held and room < (capacity + 1) // 2):
        return 0
    return max(prefetch, room)


def receive_requests(order: Sequence[str] | None, exclude: Collection[str],
                     wait_s: float) -> list[dict[str, Any]]:
    """The receives to try in turn until one returns tasks (their keyword arguments):
    the plan's ``order`` first when there is one (keys it does not know yet come after,
    in the second); the last leaves out ``exclude`` and waits up to ``wait_s``."""
    listen = [dict(keys=list(order))] if order else []
    return listen + [dict(wait_s=wait_s, exclude=sorted(exclude) or None)]


def poll_places(routes: Sequence[tuple[QueueInfo, Sequence[int]]], turn: int
                ) -> list[tuple[QueueInfo, int]]:
    """Every (queue, subqueue) to look in, each queue's in its receive order, starting
    ``turn`` places further each time so that no subqueue always comes first."""
    places = [(queue, sq) for queue, order in routes for sq in order]
    if not places:
        return []
    start = turn % len(places)
    return places[start:] + places[:start]


def long_poll_group(places: Sequence[tuple[QueueInfo, int]]) -> tuple[QueueInfo, list[int]]:
    """The first place's queue and its subqueues on the first place's shard: one parked
    call waits on all of them."""
    queue, first = places[0]
    shard = queue.subqueue(first).shard
    return queue, [sq for q, sq in places if q is queue and q.subqueue(sq).shard == shard]


def excluded_keys(suspended: Collection[str], saturated: Collection[str],
                  key_mode: str) -> set[str]:
    """The keys a receive leaves out: suspended ones, and saturated types when the
    fairness key is the type (otherwise a key does not name one type)."""
    return set(suspended) | (set(saturated) if key_mode == "type" else set())


@dataclass(frozen=True)
class Unloadable:
    """In place of a handler this consumer could not load (its module is not installed
    where the consumer runs, say): its type alone is disabled, and its tasks are
    dead-lettered with this error once ``unrunnable_after_s`` passed."""

    error_type: str
    message: str

    def outcome_message(self, type_: str) -> str:
        return f"the handler of task type {type_!r} cannot be loaded: {self.message}"


def runnable(handler: tuple[TaskSpec, Any, bytes] | None) -> bool:
    """Whether a consumer can run a task whose type has ``handler`` (None: none known)."""
    return handler is not None and not isinstance(handler[1], Unloadable)


def unrunnable_outcome(type_: str, handler: tuple[TaskSpec, Any, bytes] | None) -> bytes:
    """The outcome a task of ``type_`` is dead-lettered with when no consumer could run
    it in time: no handler registered, or one that cannot be loaded (its error)."""
    if handler is None:
        return encode_error("LookupError", f"no handler is registered for task type {type_!r}")
    return encode_error(handler[1].error_type, handler[1].outcome_message(type_))


Launch = Callable[[TaskSpec, bytes, dict], Any]  # (spec, pickled handler, Ray options) -> fn


def refreshed_handlers(known: Mapping[str, tuple[TaskSpec, Any, bytes]],
                       table: Mapping[str, tuple[TaskSpec, bytes]],
                       load: Callable[[bytes], Any],
                       launch: Launch | None = None) -> dict[str, tuple[TaskSpec, Any, bytes]]:
    """The handler table after the manager's ``table``: a handler whose spec and bytes
    did not change is kept as loaded (or as :class:`Unloadable`: loaded again once its
    type is registered anew); others are loaded, each on its own, so one that fails to
    load stands as Unloadable and disables no other type.

    A type that runs on the consumer's threads is loaded with ``load`` (the pickled
    handler -> the function); one that runs as a Ray task
    (:func:`~rayq.core.control.ray_tasks.ray_options`) with ``launch`` (spec, pickled
    handler, Ray options -> a coroutine function that runs a call as a Ray task, made
    once here per type and handler version). Without ``launch`` every type is loaded."""
    out = {}
    for type_, (spec, blob) in table.items():
        old = known.get(type_)
        if old is not None and old[0] == spec and old[2] == blob:
            out[type_] = old
            continue
        options = ray_options(spec) if launch is not None else None
        try:
            fn = load(blob) if options is None else launch(spec, blob, options)
        except Exception as err:  # noqa: BLE001 - any failure to unpickle: that type alone
            fn = Unloadable(type(err).__name__, str(err))
        out[type_] = (spec, fn, blob)
    return out


# -- which keys first --------------------------------------------------------------------
class PlanFollower:
    """A consumer's copy of the coordinator's listen plan, and the usage it spent since
    the plan came (every consumer is assumed to spend alike)."""

    def __init__(self, index: int, rng: random.Random):
        self.index = index
        self.plan: ListenPlan | None = None
        self.spent: dict[str, float] = {}
        self.nodes: frozenset[str] = frozenset()  # the names of the node it runs on
        self.ordered = 0  # receives whose key order came from the plan
        self._rng = rng

    @property
    def version(self) -> int | None:
        return self.plan.version if self.plan is not None else None

    @property
    def suspended(self) -> frozenset[str]:
        return self.plan.suspended if self.plan is not None else frozenset()

    def adopt(self, plan: ListenPlan | None) -> None:
        """Follow ``plan`` (None: the coordinator had nothing newer)."""
        if plan is not None:
            self.plan, self.spent = plan, {}

    def spend(self, key: str, usage_s: float) -> None:
        if self.plan is not None:
            self.spent[key] = self.spent.get(key, 0.0) + usage_s * max(
                1, self.plan.regular_consumers)

    def order(self, exclude: Collection[str]) -> list[str] | None:
        """This receive's key order from the plan while it intervenes (or, for a booster,
        while keys hold permits); None leaves the order to the shard's fair dispatch,
        which is fair from the first second. A passive plan, or one whose intervention
        is off on this consumer's node, never orders."""
        plan = self.plan
        if plan is None or plan.decision is None or not plan.keys:
            return None
        if not plan.intervention.acts_on(self.nodes):
            return None
        booster = self.index >= plan.regular_consumers
        if not plan.decision.intervening and not (booster and plan.decision.permits):
            return None
        self.ordered += 1
        return listen_order(plan.decision, plan.keys, self._rng, exclude,
                            booster=booster, spent=self.spent)
