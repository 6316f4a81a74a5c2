"""ConsumerActor: runs task handlers, balancing its own polling by hit rate
(docs/consumer-balancing.md).

A consumer runs ``load`` pollers at once, each receiving a task (long poll),
running its handler on a worker thread and ending it. The load follows the
hit rate the consumer observes (:mod:`rayq.core.balancer`); consumers never
talk to each other. Delivery is at-least-once: a message is deleted only
after its handler returned, and a consumer that dies mid-handler stops
extending the message's visibility, so it reappears for someone else.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil
import ray
from ray import cloudpickle

from actors import COORDINATOR, MANAGER, NAMESPACE, consumer_name, shard_name
from actors.metrics import BackgroundFailures
from rayq.batching import AsyncBatcher
from rayq.channel import ShardLink
from rayq.config import Config
from rayq.core.balancer import BalancerState, HostReading, host_pressed
from rayq.core.batcher import Batcher
from rayq.core.clock import SystemClock
from rayq.core.fairness import ListenPlan, listen_order
from rayq.core.model import StoredMessage
from rayq.core.wire import decode_delivered
from rayq.core.registry import QueueInfo
from rayq.core.routes import RouteCache
from rayq.core.tasks import (DeferralCause, Outcome, TaskSpec, UsageReport, decode_call,
                             encode_result, error_of)
from rayq.errors import RayqError, ReceiptInvalid

log = logging.getLogger("rayq.consumer")
MAX_REPORTS = 100_000   # reports kept for the coordinator between two drains


@dataclass(frozen=True)
class ConsumerStats:
    """One consumer's balancer state and counters since it started (its finished
    tasks go to the coordinator as usage reports: see ``client.task_stats()``).

    polls: receive calls; hits: those that returned a task; deferrals: tasks
    put back unrun (a concurrency limit, host pressure, a suspended key, no
    handler: see ``DeferralCause``); lost: tasks
    whose receipt went stale before they were ended (someone else re-ran them).
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

    @property
    def empty_polls(self) -> int:
        return self.polls - self.hits


class _Ends:
    """The ends of tasks (finish, defer, retry later) bound for one shard: calls made
    while one is in flight ride together in the next (one round trip, one commit)."""

    MAX_CALLS = 500

    def __init__(self, shard):
        calls = Batcher(max_items=self.MAX_CALLS, name="task ends")
        self._batcher = AsyncBatcher(calls, lambda batch: unwrap(shard.end_many.remote(batch)))

    def call(self, name: str, *args) -> Awaitable[Any]:
        """The result of shard call ``name(*args)``, or its error raised."""
        return self._batcher.call((name, args))


@dataclass
class _Held:
    """A task this consumer holds: where it lives and its current receipt."""

    message: StoredMessage
    queue: QueueInfo
    shard: Any
    ends: _Ends
    receipt: str


class ConsumerActor:
    def __init__(self, index: int, config: Config):
        self.index, self.config, self.cc = index, config, config.consumers
        self.manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
        self.shards = [ShardLink(ray.get_actor(shard_name(i), namespace=NAMESPACE),
                                 config.store.local_channel)
                       for i in range(config.store.shards)]
        self.balancer = BalancerState.initial(self.cc)
        self._threads = ThreadPoolExecutor(max_workers=self.cc.max_load,
                                           thread_name_prefix=f"consumer-{index}")
        self._handlers: dict[str, tuple[TaskSpec, Any, bytes]] = {}  # type -> (spec, fn, pickled)
        self._tasks_version: int | None = None
        self._routes = RouteCache(SystemClock())
        self._rotation = itertools.count()
        self._saturated: dict[str, float] = {}   # type -> monotonic time it may run again
        self._pollers: dict[int, asyncio.Task] = {}
        self._ends = [_Ends(shard) for shard in self.shards]
        self._reports: deque[UsageReport] = deque(maxlen=MAX_REPORTS)
        self._polls = self._hits = self._deferrals = self._lost = self._running = 0
        self._held = 0      # tasks received and not yet ended
        self._claimed = 0   # tasks asked for by receives under way
        self._room = asyncio.Event()  # set when a held task ends
        self._stopping = False
        self._fixed: int | None = None
        self._plan: ListenPlan | None = None
        self._spent: dict[str, float] = {}  # usage since the plan, scaled to all consumers
        self._rng = random.Random(index)
        self._pressed = False  # the host over its memory or CPU limit (read every adjust)
        self.failures = BackgroundFailures("consumer", index)
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    # -- public calls --------------------------------------------------------------
    async def stats(self) -> ConsumerStats:
        return ConsumerStats(self.index, self.balancer.load, self.balancer.hit_rate,
                             self._polls, self._hits, self._running, self._deferrals,
                             self._lost, self.failures.total,
                             self._plan.version if self._plan else None)

    async def drain_reports(self) -> list[UsageReport]:
        """The usage reports of every task finished since the last drain (for the coordinator)."""
        reports = list(self._reports)
        self._reports.clear()
        return reports

    async def set_fixed_load(self, load: int | None) -> None:
        """Pin the load (no balancing), or None to balance again: for benchmarks."""
        self._fixed = load

    async def stop(self, timeout_s: float = 60.0) -> list[UsageReport]:
        """Stop polling, wait (up to ``timeout_s``) for running handlers to finish, and
        hand back the reports not drained yet."""
        self._stopping = True
        pollers = list(self._pollers.values())
        if pollers:
            await asyncio.wait(pollers, timeout=timeout_s)
        return await self.drain_reports()

    async def ping(self) -> int:
        return self.index

    # -- the load ------------------------------------------------------------------
    async def _supervise(self) -> None:
        """Every adjust interval: refresh handlers, move the load, match pollers to it."""
        while not self._stopping:
            try:
                await self._refresh_handlers()
                await self._refresh_plan()
            except (RayqError, ray.exceptions.RayError, ValueError) as err:
                self.failures.record("refresh", err)  # keep the plan and handlers we have
            self.balancer = self.balancer.adjusted(self.cc)
            self._pressed = host_pressed(read_host(), self.cc)
            for slot in range(self._load()):
                if slot not in self._pollers or self._pollers[slot].done():
                    self._pollers[slot] = asyncio.get_running_loop().create_task(self._poll(slot))
            await asyncio.sleep(self.cc.adjust_interval_s)

    def _load(self) -> int:
        return self._fixed if self._fixed is not None else self.balancer.load

    async def _poll(self, slot: int) -> None:
        """One poller: receive, run, end; it leaves when the load drops below its slot.

        A receive asks for as many tasks as the load leaves room for (the load is the
        balancer's, so the batch size follows the hit rate), and runs them at once; a
        poller that finds no room waits for a task to end instead of polling."""
        while not self._stopping and slot < self._load():
            if not self._handlers:
                await asyncio.sleep(self.cc.poll_wait_s)
                continue
            self._room.clear()  # before looking: a task ending from here on sets it again
            room = self._load() - self._held - self._claimed
            if room <= 0 or (self._held and room < (self._load() + 1) // 2):
                # while tasks run, wait until half the load is free: receiving each
                # slot as it frees made receives of one task (a commit each)
                try:
                    await asyncio.wait_for(self._room.wait(), self.cc.poll_wait_s)
                except asyncio.TimeoutError:
                    pass  # look again: the load may have grown meanwhile
                continue
            want = max(self.cc.prefetch, room)
            self._claimed += want
            try:
                held = await self._receive(want)
            except (RayqError, ray.exceptions.RayError) as err:
                self.failures.record("receive", err)
                await asyncio.sleep(0.5)  # a shard restarting
                continue
            finally:
                self._claimed -= want
            self._polls += 1
            self._hits += bool(held)
            self.balancer = self.balancer.polled(bool(held))
            self._held += len(held)
            await asyncio.gather(*(self._run_held(task) for task in held))

    async def _run_held(self, task: _Held) -> None:
        try:
            await self._run(task)
        except (RayqError, ray.exceptions.RayError) as err:
            # a shard or the manager went away mid-task: the task reappears
            log.warning("consumer %d lost task %s: %r", self.index, task.message.id, err)
        finally:
            self._held -= 1
            self._room.set()

    async def _refresh_handlers(self) -> None:
        version, table = await self.manager.task_table.remote(self._tasks_version)
        if table is None:
            return
        handlers = {}
        for type_, (spec, blob) in table.items():
            known = self._handlers.get(type_)
            handlers[type_] = known if known and known[0] == spec and known[2] == blob \
                else (spec, cloudpickle.loads(blob), blob)
        self._handlers, self._tasks_version = handlers, version

    async def _refresh_plan(self) -> None:
        coordinator = ray.get_actor(COORDINATOR, namespace=NAMESPACE)
        plan = await coordinator.plan.remote(self._plan.version if self._plan else None)
        if plan is not None:
            self._plan = plan
            self._spent = {}

    def _listen(self, exclude: set[str]) -> list[str] | None:
        """This receive's key order from the coordinator's plan while it intervenes (or,
        for a booster, while keys hold permits); None leaves the order to the shard's
        fair dispatch, which is fair from the first second."""
        plan = self._plan
        if plan is None or plan.decision is None or not plan.keys:
            return None
        booster = self.index >= plan.regular_consumers
        if not plan.decision.intervening and not (booster and plan.decision.permits):
            return None
        return listen_order(plan.decision, plan.keys, self._rng, exclude,
                            booster=booster, spent=self._spent)

    # -- receiving -----------------------------------------------------------------
    async def _route(self, name: str) -> tuple[QueueInfo, list[int]]:
        route = self._routes.get(name)
        if route is None:
            queue, order = await self.manager.receive_routing.remote(name)
            route = self._routes.put(name, queue, order)
        return route.queue, route.order

    async def _receive(self, want: int) -> list[_Held]:
        """Up to ``want`` tasks: a pass over every task subqueue without waiting, then one
        long poll."""
        names = sorted({spec.queue for spec, *_ in self._handlers.values()})
        places = []
        for name in names:
            queue, order = await self._route(name)
            places.extend((queue, sq) for sq in order)
        if not places:
            await asyncio.sleep(self.cc.poll_wait_s)
            return []
        start = next(self._rotation) % len(places)
        places = places[start:] + places[:start]
        for queue, sq in places:
            got = await self._receive_from(queue, sq, want, wait_s=0.0)
            if got or self._stopping:
                return got
        queue, first = places[0]  # one parked call for that queue's subqueues on its shard
        index = queue.subqueue(first).shard
        together = [sq for q, sq in places if q is queue and q.subqueue(sq).shard == index]
        return await self._receive_from(queue, together, want, wait_s=self.cc.poll_wait_s)

    async def _receive_from(self, queue: QueueInfo, sq: int | list[int], want: int,
                            wait_s: float) -> list[_Held]:
        index = queue.subqueue(sq[0] if isinstance(sq, list) else sq).shard
        shard = self.shards[index]
        now = time.monotonic()
        exclude = set(self._plan.suspended) if self._plan else set()
        if self.config.fairness.key == "type":
            exclude |= {t for t, until in self._saturated.items() if until > now}
        options = dict(max_receives=queue.max_receives, dead_letter=queue.dead_letter_on(index))
        order = self._listen(exclude) if wait_s == 0 else None
        got = []
        if order:  # the plan's order first; keys it does not know yet come after
            got = decode_delivered(await unwrap(shard.receive.remote(
                sq, want, self.cc.visibility_timeout_s, keys=order, **options)))
        if not got:
            got = decode_delivered(await unwrap(shard.receive.remote(
                sq, want, self.cc.visibility_timeout_s, wait_s=wait_s,
                exclude=sorted(exclude) or None, **options)))
        return [_Held(m, queue, shard, self._ends[index], m.receipt) for m in got]

    # -- running -------------------------------------------------------------------
    async def _run(self, held: _Held) -> None:
        m = held.message
        handler = self._handlers.get(m.type)
        if handler is None:  # registered a moment ago, or not at all: look again first
            await self._refresh_handlers()
            handler = self._handlers.get(m.type)
        cause = self._held_back(m, handler)
        if cause is not None:
            await self._defer(held, cause)
            if cause is DeferralCause.HOST_PRESSURE:
                await asyncio.sleep(self.cc.defer_s)  # back off: the host needs a rest
            return
        spec, fn, _ = handler
        lease = f"{self.index}:{m.id}:{m.dequeue_count}"
        if spec.concurrency and not await unwrap(self.manager.acquire.remote(
                m.type, lease, spec.concurrency, self.cc.visibility_timeout_s)):
            self._saturated[m.type] = time.monotonic() + self.cc.defer_s
            await self._defer(held, DeferralCause.CONCURRENCY)
            return
        self._running += 1
        started = time.time()
        try:
            ok, outcome = await self._call(fn, held, spec, lease)
        finally:
            self._running -= 1
            if spec.concurrency:
                await self.manager.release.remote(m.type, lease)
        usage_s = time.time() - started
        ending = await self._end(held, spec, ok, outcome)
        self._report(held, usage_s, ending, started - m.enqueued_at)

    async def _call(self, fn, held: _Held, spec: TaskSpec, lease: str) -> tuple[bool, bytes]:
        """Run the handler while a heartbeat keeps the task hidden; (ok, encoded outcome)."""
        done = asyncio.Event()
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(held, spec, lease, done))
        try:
            args, kwargs = decode_call(held.message.body)
            if inspect.iscoroutinefunction(fn):
                value = await fn(*args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))
            return True, encode_result(value, held.message.type)
        except Exception as err:  # the handler's failure is the task's outcome
            return False, error_of(err)
        finally:
            done.set()
            await heartbeat  # let an extension in flight land, so our receipt stays current

    async def _heartbeat(self, held: _Held, spec: TaskSpec, lease: str, done: asyncio.Event):
        interval = self.cc.visibility_timeout_s / 3
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), interval)
                return
            except asyncio.TimeoutError:
                pass
            try:
                held.receipt = await unwrap(held.shard.change_visibility.remote(
                    held.receipt, self.cc.visibility_timeout_s))
                if spec.concurrency:
                    await self.manager.renew.remote(held.message.type, lease,
                                                    self.cc.visibility_timeout_s)
            except (RayqError, ray.exceptions.RayError):
                return  # lost the task (or its shard): whoever holds it now finishes it

    async def _end(self, held: _Held, spec: TaskSpec, ok: bool, outcome: bytes) -> Outcome:
        """Delete a finished task, retry a failed one later, dead-letter a failed last try.

        The last try is the task's own ``max_receives`` or the queue's, whichever
        comes first (the queue's also catches tasks whose consumers died)."""
        m, queue = held.message, held.queue
        last_try = m.dequeue_count >= min(spec.max_receives, queue.max_receives or spec.max_receives)
        try:
            if ok:
                await held.ends.call("finish", held.receipt, outcome, None)
                return Outcome.SUCCEEDED
            if last_try:
                shard = queue.subqueue(m.subqueue).shard
                await held.ends.call("finish", held.receipt, outcome, queue.dead_letter_on(shard))
                return Outcome.DEAD
            backoff = min(self.cc.retry_backoff_s * 2 ** (m.dequeue_count - 1), self.cc.max_backoff_s)
            await held.ends.call("change_visibility", held.receipt, backoff)
            return Outcome.FAILED
        except ReceiptInvalid:
            self._lost += 1  # it became visible again and someone else took it
            return Outcome.SUCCEEDED if ok else Outcome.FAILED

    def _held_back(self, m: StoredMessage, handler) -> DeferralCause | None:
        """Why a received task must not run now, if it must not (before any lease)."""
        if handler is None:
            return DeferralCause.CANNOT_RUN
        if self._plan is not None and m.key in self._plan.suspended:
            return DeferralCause.SUSPENDED  # suspended after we received it
        if self._pressed:
            return DeferralCause.HOST_PRESSURE
        return None

    async def _defer(self, held: _Held, cause: DeferralCause) -> None:
        """Put a task back unrun; it counts as a deferral of its key, with its cause."""
        self._deferrals += 1
        await self._put_back(held, self.cc.defer_s)
        self._report(held, 0.0, Outcome.DEFERRED, time.time() - held.message.enqueued_at, cause)

    async def _put_back(self, held: _Held, delay_s: float) -> None:
        """Hide a task we will not run for ``delay_s``; the delivery is not counted."""
        try:
            await held.ends.call("defer", held.receipt, delay_s)
        except ReceiptInvalid:
            self._lost += 1

    def _report(self, held: _Held, usage_s: float, outcome: Outcome, wait_s: float,
                cause: DeferralCause | None = None) -> None:
        m = held.message
        report = UsageReport(m.key, m.tenant, m.type, usage_s, outcome, max(0.0, wait_s),
                             time.time(), m.id, m.dequeue_count, held.queue.name, cause)
        if self._plan is not None:  # every consumer is assumed to spend alike
            self._spent[m.key] = self._spent.get(m.key, 0.0) + usage_s * max(
                1, self._plan.regular_consumers)
        self._reports.append(report)


async def unwrap(ref) -> Any:
    """Await a runtime call (a Ray ObjectRef, or a local channel's future), raising the
    RayqError a runtime actor raised as itself."""
    if isinstance(ref, Future):
        return await asyncio.wrap_future(ref)
    try:
        return await ref
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, RayqError):
            raise err.cause from None
        raise


def read_host() -> HostReading:
    """Memory in use and CPU busy on this host (CPU since the previous call)."""
    return HostReading(psutil.virtual_memory().percent, psutil.cpu_percent(interval=None))


ConsumerRemote = ray.remote(ConsumerActor)


def named_consumers() -> dict[int, Any]:
    """Every consumer actor running in the cluster's rayq namespace, by index."""
    prefix = consumer_name("")
    out = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor.get("namespace") == NAMESPACE and actor["name"].startswith(prefix):
            try:
                out[int(actor["name"][len(prefix):])] = ray.get_actor(actor["name"],
                                                                      namespace=NAMESPACE)
            except ValueError:
                pass  # gone between listing and lookup
    return out
