"""ConsumerActor: runs task handlers, balancing its own polling by hit rate
(docs/consumer-balancing.md).

A consumer runs ``load`` pollers at once, each receiving a task (long poll),
running its handler on a worker thread and ending it. The load follows the
hit rate the consumer observes (:mod:`rayq.core.control.balancer`); consumers never
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
from collections import deque
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
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
from rayq.core.control.balancer import BalancerState, HostReading, host_pressed
from rayq.core.kit.batcher import Batcher
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.control.consuming import (DeadLetter, PlanFollower, Saturation, decide_end,
                                 effective_load, excluded_keys, gives_up, held_back,
                                 long_poll_group, poll_places, pause_after, receive_requests, receive_size,
                                 recent_task_s, refreshed_handlers, slots_to_start)
from rayq.core.control.managing import indexes_by_name
from rayq.core.codec.model import StoredMessage
from rayq.core.control.registry import QueueInfo
from rayq.core.control.routes import RouteCache
from rayq.core.codec.tasks import (DeferralCause, Outcome, TaskSpec, UsageReport, decode_call,
                             encode_error, encode_result, error_of)
from rayq.core.codec.wire import decode_delivered
from rayq.errors import RayqError, ReceiptInvalid
from rayq.remote import actor_names, call_async, running

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
        self._batcher = AsyncBatcher(
            calls, lambda batch: call_async(lambda: shard.end_many.remote(batch)))

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
    def __init__(self, index: int, config: Config, clock: Clock | None = None):
        self.index, self.config, self.consumer_config = index, config, config.consumers
        self.clock = clock or SystemClock()
        self.manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
        self.shards = [ShardLink(ray.get_actor(shard_name(i), namespace=NAMESPACE),
                                 config.store.local_channel)
                       for i in range(config.store.shards)]
        self.balancer = BalancerState.initial(self.consumer_config)
        self._threads = ThreadPoolExecutor(max_workers=self.consumer_config.max_load,
                                           thread_name_prefix=f"consumer-{index}")
        self._handlers: dict[str, tuple[TaskSpec, Any, bytes]] = {}  # type -> (spec, fn, pickled)
        self._tasks_version: int | None = None
        self._routes = RouteCache(self.clock)
        self._rotation = itertools.count()
        self._saturated = Saturation(self.consumer_config.defer_s)  # on the monotonic clock
        self._pollers: dict[int, asyncio.Task] = {}
        self._ends = [_Ends(shard) for shard in self.shards]
        self._reports: deque[UsageReport] = deque(maxlen=MAX_REPORTS)
        self._polls = self._hits = self._deferrals = self._lost = self._running = 0
        self._held = 0      # tasks received and not yet ended
        self._claimed = 0   # tasks asked for by receives under way
        self._task_s: float | None = None  # recent mean handler time
        self._room = asyncio.Event()  # set when a held task ends
        self._stopping = False
        self._fixed: int | None = None
        self._plan = PlanFollower(index, random.Random(index))
        self._pressed = False  # the host over its memory or CPU limit (read every adjust)
        self.failures = BackgroundFailures("consumer", index)
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    # -- public calls --------------------------------------------------------------
    async def stats(self) -> ConsumerStats:
        return ConsumerStats(self.index, self.balancer.load, self.balancer.hit_rate,
                             self._polls, self._hits, self._running, self._deferrals,
                             self._lost, self.failures.total, self._plan.version)

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
            # a failed refresh keeps the plan and handlers we have
            await self.failures.guarded("refresh", self._refresh, also=(ValueError,))
            self.balancer = self.balancer.adjusted(self.consumer_config)
            self._pressed = host_pressed(read_host(), self.consumer_config)
            running = {slot for slot, poller in self._pollers.items() if not poller.done()}
            for slot in slots_to_start(self._load(), running):
                self._pollers[slot] = asyncio.get_running_loop().create_task(self._poll(slot))
            await asyncio.sleep(self.consumer_config.adjust_interval_s)

    def _load(self) -> int:
        return effective_load(self._fixed, self.balancer.load)

    async def _poll(self, slot: int) -> None:
        """One poller: receive, run, end; it leaves when the load drops below its slot.

        A receive asks for as many tasks as the load leaves room for (the load is the
        balancer's, so the batch size follows the hit rate), and runs them at once; a
        poller that finds no room waits for a task to end instead of polling."""
        while not self._stopping and slot < self._load():
            if not self._handlers:
                await asyncio.sleep(self.consumer_config.poll_wait_s)
                continue
            self._room.clear()  # before looking: a task ending from here on sets it again
            want = receive_size(self._load(), self._held, self._claimed,
                                self.consumer_config.prefetch, self._task_s)
            if not want:
                try:
                    await asyncio.wait_for(self._room.wait(), self.consumer_config.poll_wait_s)
                except asyncio.TimeoutError:
                    pass  # look again: the load may have grown meanwhile
                continue
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

    async def _refresh(self) -> None:
        await self._refresh_handlers()
        await self._refresh_plan()

    async def _refresh_handlers(self) -> None:
        version, table = await call_async(
            lambda: self.manager.task_table.remote(self._tasks_version))
        if table is not None:  # None: unchanged since our version
            self._handlers = refreshed_handlers(self._handlers, table, cloudpickle.loads)
            self._tasks_version = version

    async def _refresh_plan(self) -> None:
        coordinator = ray.get_actor(COORDINATOR, namespace=NAMESPACE)
        self._plan.adopt(await call_async(lambda: coordinator.plan.remote(self._plan.version)))

    # -- receiving -----------------------------------------------------------------
    async def _route(self, name: str) -> tuple[QueueInfo, list[int]]:
        route = self._routes.get(name)
        if route is None:
            queue, order = await call_async(lambda: self.manager.receive_routing.remote(name))
            route = self._routes.put(name, queue, order)
        return route.queue, route.order

    async def _receive(self, want: int) -> list[_Held]:
        """Up to ``want`` tasks: a pass over every task subqueue without waiting, then one
        long poll."""
        names = sorted({spec.queue for spec, *_ in self._handlers.values()})
        places = poll_places([await self._route(name) for name in names], next(self._rotation))
        if not places:
            await asyncio.sleep(self.consumer_config.poll_wait_s)
            return []
        for queue, sq in places:
            got = await self._receive_from(queue, [sq], want, wait_s=0.0)
            if got or self._stopping:
                return got
        queue, together = long_poll_group(places)
        return await self._receive_from(queue, together, want,
                                        wait_s=self.consumer_config.poll_wait_s)

    async def _receive_from(self, queue: QueueInfo, sq: list[int], want: int,
                            wait_s: float) -> list[_Held]:
        """Receive from subqueues ``sq`` of ``queue``, all on one shard."""
        index = queue.subqueue(sq[0]).shard
        shard = self.shards[index]
        exclude = excluded_keys(self._plan.suspended,
                                self._saturated.saturated(self.clock.monotonic()),
                                self.config.fairness.key)
        options = dict(max_receives=queue.max_receives, dead_letter=queue.dead_letter_on(index))
        order = self._plan.order(exclude) if wait_s == 0 else None  # long polls: no plan
        for request in receive_requests(order, exclude, wait_s):
            got = decode_delivered(await call_async(lambda: shard.receive.remote(
                sq, want, self.consumer_config.visibility_timeout_s, **request, **options)))
            if got:
                break
        return [_Held(m, queue, shard, self._ends[index], m.receipt) for m in got]

    # -- running -------------------------------------------------------------------
    async def _run(self, held: _Held) -> None:
        m = held.message
        handler = self._handlers.get(m.type)
        if handler is None:  # registered a moment ago, or not at all: look again first
            await self._refresh_handlers()
            handler = self._handlers.get(m.type)
        cause = held_back(handler is not None, m.key, self._plan.suspended, self._pressed)
        if cause is not None and gives_up(cause, m.enqueued_at, self.clock.now(),
                                          self.consumer_config.unrunnable_after_s):
            await self._give_up(held)
            return
        if cause is not None:
            await self._defer(held, cause)
            await asyncio.sleep(pause_after(cause, self.consumer_config.defer_s))
            return
        spec, fn, _ = handler
        lease = f"{self.index}:{m.id}:{m.dequeue_count}"
        if spec.concurrency and not await call_async(lambda: self.manager.acquire.remote(
                m.type, lease, spec.concurrency, self.consumer_config.visibility_timeout_s)):
            self._saturated.saturate(m.type, self.clock.monotonic())
            await self._defer(held, DeferralCause.CONCURRENCY)
            return
        self._running += 1
        started = self.clock.now()
        try:
            ok, outcome = await self._call(fn, held, spec, lease)
        finally:
            self._running -= 1
            if spec.concurrency:
                await call_async(lambda: self.manager.release.remote(m.type, lease))
        usage_s = self.clock.now() - started
        self._task_s = recent_task_s(self._task_s, usage_s)
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
        interval = self.consumer_config.visibility_timeout_s / 3
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), interval)
                return
            except asyncio.TimeoutError:
                pass
            try:
                held.receipt = await call_async(lambda: held.shard.change_visibility.remote(
                    held.receipt, self.consumer_config.visibility_timeout_s))
                if spec.concurrency:
                    await call_async(lambda: self.manager.renew.remote(
                        held.message.type, lease, self.consumer_config.visibility_timeout_s))
            except (RayqError, ray.exceptions.RayError):
                return  # lost the task (or its shard): whoever holds it now finishes it

    async def _end(self, held: _Held, spec: TaskSpec, ok: bool, outcome: bytes) -> Outcome:
        """Delete a finished task, retry a failed one later, dead-letter a failed last
        try (:func:`rayq.core.control.consuming.decide_end` decides which)."""
        m, queue = held.message, held.queue
        end = decide_end(ok, m.dequeue_count, spec, queue.max_receives, self.consumer_config)
        dead_letter = queue.dead_letter_on(queue.subqueue(m.subqueue).shard)
        name, args = end.shard_call(held.receipt, outcome, dead_letter)
        try:
            await held.ends.call(name, *args)
            return end.outcome
        except ReceiptInvalid:
            self._lost += 1  # it became visible again and someone else took it
            return end.outcome_if_lost

    async def _give_up(self, held: _Held) -> None:
        """Dead-letter a task no handler was registered for in time, with that error."""
        m, queue = held.message, held.queue
        error = encode_error("LookupError", f"no handler is registered for task type {m.type!r}")
        end = DeadLetter()
        name, args = end.shard_call(held.receipt, error,
                                    queue.dead_letter_on(queue.subqueue(m.subqueue).shard))
        try:
            await held.ends.call(name, *args)
        except ReceiptInvalid:
            self._lost += 1
        self._report(held, 0.0, end.outcome, self.clock.now() - m.enqueued_at)

    async def _defer(self, held: _Held, cause: DeferralCause) -> None:
        """Put a task back unrun; it counts as a deferral of its key, with its cause."""
        self._deferrals += 1
        await self._put_back(held, self.consumer_config.defer_s)
        waited_s = self.clock.now() - held.message.enqueued_at
        self._report(held, 0.0, Outcome.DEFERRED, waited_s, cause)

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
                             self.clock.now(), m.id, m.dequeue_count, held.queue.name, cause)
        self._plan.spend(m.key, usage_s)
        self._reports.append(report)


def read_host() -> HostReading:
    """Memory in use and CPU busy on this host (CPU since the previous call)."""
    return HostReading(psutil.virtual_memory().percent, psutil.cpu_percent(interval=None))


ConsumerRemote = ray.remote(ConsumerActor)


def named_consumers() -> dict[int, Any]:
    """Every consumer actor running in the cluster's rayq namespace, by index."""
    by_index = indexes_by_name(actor_names(), consumer_name(""))
    handles = running(by_index.values())
    return {index: handles[name] for index, name in by_index.items() if name in handles}
