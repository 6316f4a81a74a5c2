"""ConsumerActor: runs task handlers, balancing its own polling by hit rate
(docs/consumer-balancing.md).

A consumer runs ``load`` pollers at once, each receiving a task (long poll),
running its handler on a worker thread (or, for a type with Ray options, as a Ray
task it awaits: :mod:`actors.ray_tasks`) and ending it. The load follows the
hit rate the consumer observes (:mod:`rayq.core.consumers.balancer`); every count
and decision is kept by :class:`~rayq.core.consumers.state.ConsumerState`,
and this actor only makes the calls. Consumers never
talk to each other. Delivery is at-least-once: a message is deleted only
after its handler returned, and a consumer that dies mid-handler stops
extending the message's visibility, so it reappears for someone else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil
import ray
from ray import cloudpickle

from rayq.names import COORDINATOR, namespace, consumer_name
from actors.base import RuntimeActor
from actors.ray_tasks import RayTasks
from rayq.batching import AsyncBatcher
from rayq.config import Config
from rayq.core.consumers.balancer import HostReading, host_pressed
from rayq.core.consumers.state import ConsumerState, ConsumerStats
from rayq.core.kit.batcher import Batcher
from rayq.core.kit.clock import Clock
from rayq.core.consumers.decisions import (DeadLetter, Deferral, decide_end, gives_up,
                                           long_poll_group, may_retry, pause_after,
                                           receive_requests, runnable, unrunnable_outcome)
from rayq.core.control.managing import indexes_by_name
from rayq.core.codec.model import StoredMessage
from rayq.core.control.registry import QueueInfo
from rayq.core.control.routes import RouteCache
from rayq.core.codec.tasks import DeferralCause, TaskSpec, decode_call, encode_result, error_of
from rayq.core.codec.wire import decode_delivered
from rayq.core.storage.writes import End, RecordUsage, compact
from rayq.errors import InvalidMessage, RayqError, ReceiptInvalid, RuntimeFailure
from rayq.remote import (IN_RUNTIME, NO_RETRY, actor_names, call_async, manager_link, running,
                         shard_link)

log = logging.getLogger("rayq.consumer")
__all__ = ["ConsumerActor", "ConsumerStats", "named_consumers"]


class _Ends:
    """The ends of tasks (finish, defer, retry later) bound for one shard: ends made
    while one is in flight ride together in the next (one round trip, one commit)."""

    MAX_CALLS = 500

    def __init__(self, shard):
        calls = Batcher(max_items=self.MAX_CALLS, name="task ends")
        self._batcher = AsyncBatcher(
            calls, lambda batch: call_async(lambda: shard.end_many.remote(batch)))

    def call(self, end: End) -> Awaitable[Any]:
        """The result of write ``end`` on the shard, or its error raised."""
        return self._batcher.call(compact(end))


@dataclass
class _Held:
    """A task this consumer holds: where it lives and its current receipt."""

    message: StoredMessage
    queue: QueueInfo
    shard: Any
    ends: _Ends
    receipt: str


class ConsumerActor(RuntimeActor):
    def __init__(self, index: int, config: Config, clock: Clock | None = None):
        super().__init__("consumer", clock, index)
        self.config, self.consumer_config = config, config.consumers
        self.manager = manager_link()
        self.shards = [shard_link(i, config.store.local_channel)
                       for i in range(config.store.shards)]
        self.state = ConsumerState(index, config, self.clock)  # every count and decision
        self._threads = ThreadPoolExecutor(max_workers=self.consumer_config.max_load,
                                           thread_name_prefix=f"consumer-{index}")
        self._routes = RouteCache(self.clock)
        self._ray_tasks = RayTasks(self.clock)  # types with Ray options run as Ray tasks
        self._pollers: dict[int, asyncio.Task] = {}
        self._ends = [_Ends(shard) for shard in self.shards]
        self._room = asyncio.Event()  # set when a held task ends
        self._run_every(self.consumer_config.adjust_interval_s, "supervision", self._supervise,
                        first_s=0.0)

    # -- public calls --------------------------------------------------------------
    async def stats(self) -> ConsumerStats:
        return self.state.stats(self.failures.total)

    async def set_fixed_load(self, load: int | None) -> None:
        """Pin the load (no balancing), or None to balance again: for benchmarks."""
        self.state.pin(load)

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Stop polling and wait (up to ``timeout_s``) for running handlers to finish (their
        usage reports go to their shards with their ends)."""
        self.state.stop()
        pollers = list(self._pollers.values())
        if pollers:
            await asyncio.wait(pollers, timeout=timeout_s)

    async def ping(self) -> int:
        """The consumer's index once it is up. Answered on the consumer's own loop: it
        declares no liveness group (nothing fails a consumer over on a missed ping)."""
        return self.index

    # -- the load ------------------------------------------------------------------
    async def _supervise(self) -> None:
        """Every adjust interval until the consumer stops: refresh handlers, move the
        load, match pollers to it."""
        if self.state.stopping:
            return
        # a failed refresh keeps the plan and handlers we have
        await self.failures.guarded("refresh", self._refresh, also=(ValueError,))
        running = {slot for slot, poller in self._pollers.items() if not poller.done()}
        pressed = host_pressed(read_host(), self.consumer_config)
        for slot in self.state.adjust(pressed, running):
            self._pollers[slot] = asyncio.get_running_loop().create_task(self._poll(slot))

    async def _poll(self, slot: int) -> None:
        """One poller: receive, run, end; it leaves when the load drops below its slot.

        A receive asks for as many tasks as the load leaves room for (the load is the
        balancer's, so the batch size follows the hit rate), and runs them at once; a
        poller that finds no room waits for a task to end instead of polling."""
        state = self.state
        while not state.stopping and slot < state.load:
            if not state.handlers:
                await asyncio.sleep(self.consumer_config.poll_wait_s)
                continue
            self._room.clear()  # before looking: a task ending from here on sets it again
            want = state.claim()
            if not want:
                try:
                    await asyncio.wait_for(self._room.wait(), self.consumer_config.poll_wait_s)
                except asyncio.TimeoutError:
                    pass  # look again: the load may have grown meanwhile
                continue
            try:
                held, waited_s = await self._receive(want)
            except (RayqError, ray.exceptions.RayError) as err:
                state.receive_failed(want)
                self.failures.record("receive", err)
                await asyncio.sleep(0.5)  # a shard restarting
                continue
            state.received(want, len(held), waited_s)
            await asyncio.gather(*(self._run_held(task) for task in held))

    async def _run_held(self, task: _Held) -> None:
        try:
            await self._run(task)
        except (RayqError, ray.exceptions.RayError) as err:
            # a shard or the manager went away mid-task: the task reappears
            log.warning("consumer %d lost task %s: %r", self.index, task.message.id, err)
        finally:
            self.state.released()
            self._room.set()

    async def _refresh(self) -> None:
        await self._refresh_handlers()
        await self._refresh_plan()

    async def _refresh_handlers(self) -> None:
        version, table = await call_async(
            lambda: self.manager.task_table.remote(self.state.tasks_version))
        self.state.adopt_handlers(version, table, self._load, self._ray_tasks.launcher)

    def _load(self, blob: bytes) -> Any:
        """A registered handler, unpickled here; a failure (its module is not installed
        where this consumer runs) is counted and logged, and disables that type alone."""
        try:
            return cloudpickle.loads(blob)
        except Exception as err:
            log.warning("consumer %d cannot load a handler: %r", self.index, err)
            self.failures.record("handler load", err)
            raise

    async def _refresh_plan(self) -> None:
        coordinator = ray.get_actor(COORDINATOR, namespace=namespace())
        self.state.adopt_plan(await call_async(
            lambda: coordinator.plan.remote(self.state.plan.version)))

    # -- receiving -----------------------------------------------------------------
    async def _route(self, name: str) -> tuple[QueueInfo, list[int]]:
        route = self._routes.get(name)
        if route is None:
            try:
                queue, order = await call_async(
                    lambda: self.manager.receive_routing.remote(name),
                    NO_RETRY if self._routes.stale(name) else IN_RUNTIME)
                route = self._routes.put(name, queue, order)
            except RuntimeFailure as err:
                route = self._routes.renew(name, err)  # the manager is away: poll as before
        return route.queue, route.order

    async def _receive(self, want: int) -> tuple[list[_Held], float]:
        """Up to ``want`` tasks: a pass over every task subqueue without waiting, then one
        long poll; and how long that long poll waited (0 when the pass found tasks)."""
        places = self.state.places([await self._route(name) for name in self.state.queues])
        if not places:
            await asyncio.sleep(self.consumer_config.poll_wait_s)
            return [], self.consumer_config.poll_wait_s
        for queue, sq in places:
            got = await self._receive_from(queue, [sq], want, wait_s=0.0)
            if got or self.state.stopping:
                return got, 0.0
        queue, together = long_poll_group(places)
        began = self.clock.monotonic()
        got = await self._receive_from(queue, together, want,
                                       wait_s=self.consumer_config.poll_wait_s)
        return got, self.clock.monotonic() - began

    async def _receive_from(self, queue: QueueInfo, sq: list[int], want: int,
                            wait_s: float) -> list[_Held]:
        """Receive from subqueues ``sq`` of ``queue``, all on one shard."""
        index = queue.subqueue(sq[0]).shard
        shard = self.shards[index]
        exclude = self.state.excluded()
        options = dict(max_receives=queue.max_receives, dead_letter=queue.dead_letter_on(index))
        order = self.state.listen_order(exclude) if wait_s == 0 else None  # long polls: no plan
        for request in receive_requests(order, exclude, wait_s):
            got = decode_delivered(await call_async(lambda: shard.receive.remote(
                sq, want, self.consumer_config.visibility_timeout_s, **request, **options)))
            if got:
                break
        return [_Held(m, queue, shard, self._ends[index], m.receipt) for m in got]

    # -- running -------------------------------------------------------------------
    async def _run(self, held: _Held) -> None:
        m = held.message
        handler = self.state.handlers.get(m.type)
        if handler is None:  # registered a moment ago, or not at all: look again first
            await self._refresh_handlers()
            handler = self.state.handlers.get(m.type)
        cause = self.state.hold_back(runnable(handler), m.key)
        if cause is not None and gives_up(cause, m.enqueued_at, self.clock.now(),
                                          self.consumer_config.unrunnable_after_s):
            await self._give_up(held, unrunnable_outcome(m.type, handler))
            return
        if cause is not None:
            await self._defer(held, cause)
            await asyncio.sleep(pause_after(cause, self.consumer_config.defer_s))
            return
        spec, fn, _ = handler
        lease = f"{self.index}:{m.id}:{m.dequeue_count}"
        if spec.concurrency and not await call_async(lambda: self.manager.acquire.remote(
                m.type, lease, spec.concurrency, self.consumer_config.visibility_timeout_s)):
            self.state.saturate(m.type)
            await self._defer(held, DeferralCause.CONCURRENCY)
            return
        started = self.state.started()
        try:
            ok, outcome, retriable = await self._call(fn, held, spec, lease)
        finally:
            usage_s = self.state.finished(started)
            if spec.concurrency:
                await call_async(lambda: self.manager.release.remote(m.type, lease))
        await self._end(held, spec, ok, outcome, retriable, usage_s, started - m.enqueued_at)

    async def _call(self, fn, held: _Held, spec: TaskSpec,
                    lease: str) -> tuple[bool, bytes, bool]:
        """Run the handler while a heartbeat keeps the task hidden; (ok, encoded outcome,
        whether a failure may be retried). A value that cannot be stored is a failure
        that another run would repeat, with its side effects: not retried."""
        done = asyncio.Event()
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(held, spec, lease, done))
        try:
            args, kwargs = decode_call(held.message.body)
            if inspect.iscoroutinefunction(fn):
                value = await fn(*args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))
        except Exception as err:  # the handler's failure is the task's outcome
            return False, error_of(err), may_retry(spec, err)
        finally:
            done.set()
            await heartbeat  # let an extension in flight land, so our receipt stays current
        try:
            return True, encode_result(value, held.message.type,
                                       self.config.store.max_task_bytes), True
        except InvalidMessage as err:
            return False, error_of(err), False

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

    async def _end(self, held: _Held, spec: TaskSpec, ok: bool, outcome: bytes,
                   retriable: bool, usage_s: float, wait_s: float) -> None:
        """Delete a finished task, retry a failed one later, dead-letter a failed last
        try (:func:`rayq.core.consumers.decisions.decide_end` decides which)."""
        m, queue = held.message, held.queue
        end = decide_end(ok, m.dequeue_count, spec, queue.max_receives, self.consumer_config,
                         retriable, random.random())
        dead_letter = queue.dead_letter_on(queue.subqueue(m.subqueue).shard)
        await self._ended(held, end, end.write(held.receipt, outcome, dead_letter), usage_s,
                          wait_s)

    async def _give_up(self, held: _Held, error: bytes) -> None:
        """Dead-letter a task no handler could run in time, with ``error``
        (:func:`~rayq.core.consumers.decisions.unrunnable_outcome`)."""
        m, queue = held.message, held.queue
        end = DeadLetter()
        dead_letter = queue.dead_letter_on(queue.subqueue(m.subqueue).shard)
        await self._ended(held, end, end.write(held.receipt, error, dead_letter), 0.0,
                          self.clock.now() - m.enqueued_at)

    async def _defer(self, held: _Held, cause: DeferralCause) -> None:
        """Put a task back unrun, its delivery not counted; it counts as a deferral of its
        key, with its cause."""
        self.state.deferred()
        end = Deferral(self.consumer_config.defer_s)
        await self._ended(held, end, end.write(held.receipt, b"", None), 0.0,
                          self.clock.now() - held.message.enqueued_at, cause)

    async def _ended(self, held: _Held, end, write: End, usage_s: float, wait_s: float,
                     cause: DeferralCause | None = None) -> None:
        """Make ``end``'s write with the delivery's usage report, which the shard keeps in
        the same transaction (the coordinator takes it there: a report outlives this
        consumer). An end someone else made first keeps the report alone, with the
        outcome ``end`` has then."""
        report = self.state.report(held.message, held.queue.name, usage_s, end.outcome, wait_s,
                                   cause)
        try:
            await held.ends.call(dataclasses.replace(write, usage=report.pack()))
        except ReceiptInvalid:
            self.state.lost_one()  # it became visible again and someone else took it
            lost = dataclasses.replace(report, outcome=end.outcome_if_lost)
            await held.ends.call(RecordUsage(lost.pack()))


def read_host() -> HostReading:
    """Memory in use and CPU busy on this host (CPU since the previous call)."""
    return HostReading(psutil.virtual_memory().percent, psutil.cpu_percent(interval=None))


ConsumerRemote = ray.remote(ConsumerActor)


def named_consumers() -> dict[int, Any]:
    """Every consumer actor running in the cluster's rayq namespace, by index."""
    by_index = indexes_by_name(actor_names(), consumer_name(""))
    handles = running(by_index.values())
    return {index: handles[name] for index, name in by_index.items() if name in handles}
