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
import ctypes
import dataclasses
import functools
import inspect
import logging
import os
import random
import threading
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import psutil
import ray
from ray import cloudpickle

from rayq.names import COORDINATOR, namespace, consumer_name
from actors.base import RuntimeActor
from actors.data_nodes import this_node_names
from actors.ray_tasks import RayCall, RayTasks
from rayq.batching import AsyncBatcher
from rayq.config import Config
from rayq.core.consumers.balancer import HostReading, host_pressed
from rayq.core.consumers.state import ConsumerState, ConsumerStats
from rayq.core.kit.batcher import Batcher
from rayq.core.kit.clock import Clock
from rayq.core.kit.threads import CallThreads
from rayq.core.consumers.decisions import (DeadLetter, Deferral, Stop, call_limit_s,
                                           decide_end, forced_after_s, gives_up,
                                           long_poll_group, may_retry, pause_after,
                                           receive_requests, runnable, stop_error, stopped_end,
                                           stuck_after_s, unrunnable_outcome)
from rayq.core.control.managing import indexes_by_name
from rayq.core.codec.model import StoredMessage
from rayq.core.control.registry import QueueInfo
from rayq.core.control.routes import RouteCache
from rayq.core.codec.tasks import (DeferralCause, TaskSpec, decode_call_options, encode_result,
                                   error_of)
from rayq.core.codec.wire import decode_delivered
from rayq.core.storage.writes import End, Extend, RecordUsage, compact
from rayq.errors import InvalidMessage, RayqError, ReceiptInvalid, RuntimeFailure
from rayq.tasks import TaskContext, done_running, running_as
from rayq.remote import (IN_RUNTIME, NO_RETRY, ShardLinks, actor_names, call_async, manager_link,
                         running)

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
    """A task this consumer holds: where it lives, its current receipt (kept hidden
    until ``renewed_at`` + the visibility timeout, monotonic), and whether its shard
    said it was cancelled while it waited for its turn."""

    message: StoredMessage
    queue: QueueInfo
    shard: Any
    ends: _Ends
    receipt: str
    renewed_at: float
    cancelled: bool = False
    turn: bool = False  # it holds one of the max_load turns (see ConsumerActor._take_turn)
    extending: asyncio.Lock = field(default_factory=asyncio.Lock)  # one extension at a time


class HandlerStopped(BaseException):
    """Raised in a handler's thread to stop it (cancelled past its grace, or past its time
    limit). A BaseException, as KeyboardInterrupt is: ``except Exception`` in a handler
    does not swallow it."""


@dataclass
class _Running:
    """A handler this consumer runs now, and how to stop it: its asyncio task (``call``),
    its thread while it runs on one, its Ray task's ref."""

    held: _Held
    context: TaskContext
    # done once it was cancelled: a future, so that the watch waits on it with the call
    told: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    beat: asyncio.TimerHandle | None = None  # the next heartbeat, while the handler runs
    beating: asyncio.Task | None = None      # a heartbeat under way
    call: asyncio.Task | None = None
    ray_call: RayCall | None = None
    ref: Any = None
    thread: int | None = None
    raised: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tell(self) -> None:
        """It was cancelled (its shard says so): the watch stops it."""
        if not self.told.done():
            self.told.set_result(None)

    def entered(self) -> None:
        """On the handler's thread, as it starts."""
        with self.lock:
            self.thread = threading.get_ident()

    def left(self) -> None:
        """On the handler's thread, as it returns: no exception may be raised in it from
        now on, and one raised but not yet delivered is withdrawn (the thread goes on to
        run other tasks)."""
        with self.lock:
            if self.raised and self.thread is not None:
                _raise_in_thread(self.thread, None)
            self.thread = None

    def raise_in_thread(self) -> bool:
        """Raise HandlerStopped in the handler's thread, once; False when it runs on none."""
        with self.lock:
            if self.thread is None or self.raised:
                return False
            self.raised = _raise_in_thread(self.thread, HandlerStopped)
            return self.raised


def _raise_in_thread(thread: int, exc: type[BaseException] | None) -> bool:
    """Raise ``exc`` in thread ``thread`` when it next runs Python code (None withdraws one
    raised before): CPython's PyThreadState_SetAsyncExc. It cannot interrupt a C call
    (a sleep, a blocking read): that is why a stuck handler restarts its consumer."""
    found = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread), ctypes.py_object(exc) if exc is not None else None)
    if found > 1:  # never expected: undo, as the C API asks
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)
    return found == 1


def _on_thread(fn, run: _Running, args: list, kwargs: dict) -> Any:
    """Run a handler on a consumer thread, as ``run``'s task (``rayq.current_task()``)."""
    token = running_as(run.context)
    try:
        run.entered()
        try:
            if run.context.cancelled:  # stopped before a thread took it: its call was
                return None            # cancelled (see ConsumerActor._tell), so it never runs
            return fn(*args, **kwargs)
        finally:
            run.left()
    finally:
        done_running(token)


@dataclass(frozen=True)
class _Called:
    """How a handler call went: (ok, encoded outcome, whether a failure may be retried),
    why it was stopped (None: it was not) and whether it is stuck (it did not return
    after it was stopped by force)."""

    ok: bool
    outcome: bytes
    retriable: bool
    stop: Stop | None = None
    stuck: bool = False


class ConsumerActor(RuntimeActor):
    def __init__(self, index: int, config: Config, clock: Clock | None = None):
        super().__init__("consumer", clock, index)
        self.config, self.consumer_config = config, config.consumers
        self.manager = manager_link()
        self.shards = ShardLinks(config.store.shards, config.store.local_channel)  # grows
        self.state = ConsumerState(index, config, self.clock)  # every count and decision
        self.state.plan.nodes = this_node_names()  # where intervention may be off
        self._threads = CallThreads(self.consumer_config.max_load, f"consumer-{index}")
        # Held tasks run at most max_load at once (the threads there are): short ones are
        # held in batches of many per poller, and a task waiting for its turn has not
        # started (its handler time, time limit and heartbeats start with its turn). A
        # turn ends when the handler returns: the next task runs while the end is written.
        self._turns = asyncio.Semaphore(self.consumer_config.max_load)
        self._routes = RouteCache(self.clock)
        self._ray_tasks = RayTasks(self.clock)  # types with Ray options run as Ray tasks
        self._pollers: dict[int, asyncio.Task] = {}
        self._ends: dict[int, _Ends] = {}  # by shard index, made at its first delivery
        self._room = asyncio.Event()  # set when a held task ends
        self._running: dict[str, _Running] = {}  # by message id: what a cancel may stop
        self._waiting: dict[str, _Held] = {}  # by message id: held, waiting for a turn
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

    async def look_for_cancel(self, message_id: str) -> bool:
        """Whether the task ``message_id``, if this consumer runs it, was cancelled: asked
        of its shard now (a heartbeat ahead of time), which keeps the cancel, so a
        caller cannot stop a task the shard did not flag. False when it runs here not. A
        task held here waiting for its turn learns it too, and then never starts."""
        run = self._running.get(message_id)
        waiting = self._waiting.get(message_id)
        if run is None and waiting is not None:
            if await self._extend_waiting(waiting):
                return waiting.cancelled
            run = self._running.get(message_id)  # its turn came meanwhile
        if run is None:
            return False
        await self._extend(run)
        return run.told.done()

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
        balancer's, so the batch size follows the hit rate; with short handlers, a batch
        of them for each unit of load: see
        :func:`rayq.core.consumers.decisions.receive_size`), and runs them at once,
        at most max_load at a time; a poller that finds no room waits for a task to end
        instead of polling."""
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
            await self._take_turn(task)
            try:
                await self._run(task)
            finally:
                self._end_turn(task)
        except (RayqError, ray.exceptions.RayError) as err:
            # a shard or the manager went away mid-task: the task reappears
            log.warning("consumer %d lost task %s: %r", self.index, task.message.id, err)
        finally:
            self.state.released()
            self._room.set()

    async def _take_turn(self, task: _Held) -> None:
        """Wait until fewer than max_load held tasks run, keeping ``task`` hidden
        meanwhile: a heartbeat each third of the visibility timeout, as a running task's,
        which also learns of a cancel (the handler then never starts). Its place in line
        is kept across heartbeats. Raises ReceiptInvalid when the task was lost (counted)."""
        if not self._turns.locked():
            await self._turns.acquire()
            task.turn = True
            return
        beat_s = self.consumer_config.visibility_timeout_s / 3
        turn = asyncio.ensure_future(self._turns.acquire())
        self._waiting[task.message.id] = task
        try:
            while not (await asyncio.wait({turn}, timeout=beat_s))[0]:
                try:
                    await self._extend_waiting(task)
                except ReceiptInvalid:
                    self.state.lost_one()
                    raise
                except (RayqError, ray.exceptions.RayError) as err:  # a shard restarting:
                    log.warning("consumer %d: heartbeat of held task %s failed: %r",
                                self.index, task.message.id, err)  # again next beat
            turn.result()
            task.turn = True
        finally:
            self._waiting.pop(task.message.id, None)
            if not task.turn and not turn.cancel() and not turn.cancelled() \
                    and turn.exception() is None:
                self._turns.release()  # granted as it was given up
        async with task.extending:
            pass  # an extension under way lands first: its receipt is the current one

    async def _extend_waiting(self, task: _Held) -> bool:
        """Hide a task waiting for its turn longer, and learn whether it was cancelled;
        False, and nothing done, once its turn came (it runs, and beats, on its own)."""
        async with task.extending:
            if task.turn:
                return False
            renewed_at = self.clock.monotonic()
            task.receipt, cancelled = await task.ends.call(
                Extend(task.receipt, self.consumer_config.visibility_timeout_s))
            task.renewed_at = renewed_at
            task.cancelled = task.cancelled or cancelled
        return True

    def _end_turn(self, task: _Held) -> None:
        """``task``'s handler returned (or it never ran): the next held task may start
        while its end is written."""
        if task.turn:
            task.turn = False
            self._turns.release()

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
        if index not in self._ends:
            self._ends[index] = _Ends(shard)
        ends = self._ends[index]
        now = self.clock.monotonic()
        return [_Held(m, queue, shard, ends, m.receipt, now) for m in got]

    # -- running -------------------------------------------------------------------
    async def _run(self, held: _Held) -> None:
        m = held.message
        handler = self.state.handlers.get(m.type)
        if handler is None:  # registered a moment ago, or not at all: look again first
            await self._refresh_handlers()
            handler = self.state.handlers.get(m.type)
        if held.cancelled and handler is not None:  # cancelled while it waited: never starts
            self._end_turn(held)
            cancelled = _Called(False, error_of(stop_error(Stop.CANCELLED, None)), False,
                                Stop.CANCELLED)
            await self._end(held, handler[0], cancelled, 0.0, self.clock.now() - m.enqueued_at)
            return
        cause = self.state.hold_back(runnable(handler), m.key)
        if cause is not None:
            self._end_turn(held)  # nothing runs: the next held task may start
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
            self._end_turn(held)
            await self._defer(held, DeferralCause.CONCURRENCY)
            return
        started = self.state.started()
        called = None
        try:
            called = await self._call(fn, held, spec, lease)
        finally:
            usage_s = self.state.finished(started)
            if called is None or not called.stuck:  # a stuck one keeps its thread's turn
                self._end_turn(held)
            if spec.concurrency:
                await call_async(lambda: self.manager.release.remote(m.type, lease))
        await self._end(held, spec, called, usage_s, started - m.enqueued_at)
        if called.stuck:
            self._restart(m)

    async def _call(self, fn, held: _Held, spec: TaskSpec, lease: str) -> _Called:
        """Run the handler while a heartbeat keeps the task hidden, stopping it when it is
        cancelled or runs past its time limit (:meth:`_watch`). A value that cannot be
        stored is a failure that another run would repeat, with its side effects: not
        retried."""
        m = held.message
        try:
            args, kwargs, options = decode_call_options(m.body)
        except InvalidMessage as err:
            return _Called(False, error_of(err), may_retry(spec, err))
        run = _Running(held, TaskContext(str(options.get("id", m.id)), m.type, m.tenant,
                                         m.dequeue_count))
        self._running[m.id] = run
        self._beat_later(run, spec, lease, first=True)
        limit_s = call_limit_s(spec, options)
        try:
            run.call = asyncio.get_running_loop().create_task(self._invoke(fn, run, args, kwargs))
            stop, stuck = await self._watch(run, limit_s, spec.cancel_grace_s)
        finally:
            self._running.pop(m.id, None)
            run.beat.cancel()
            if run.beating is not None:
                await run.beating  # let an extension in flight land: our receipt stays current
        if stop is not None:
            return _Called(False, error_of(stop_error(stop, limit_s)), False, stop, stuck)
        try:
            value = run.call.result()
        except Exception as err:  # the handler's failure is the task's outcome
            return _Called(False, error_of(err), may_retry(spec, err))
        try:
            outcome = encode_result(value, m.type, self.config.store.max_task_bytes)
            return _Called(True, outcome, True)
        except InvalidMessage as err:
            return _Called(False, error_of(err), False)

    async def _invoke(self, fn, run: _Running, args: list, kwargs: dict) -> Any:
        """The handler's value: on a worker thread, as a coroutine on this loop, or as a
        Ray task; each sees ``run``'s task as ``rayq.current_task()`` (but the Ray task)."""
        if isinstance(fn, RayCall):
            run.ray_call = fn
            run.ref = await fn.launch(args, kwargs)
            return await fn.result(run.ref)
        if inspect.iscoroutinefunction(fn):
            running_as(run.context)  # this asyncio task's own context
            return await fn(*args, **kwargs)
        return await self._threads.run(functools.partial(_on_thread, fn, run, args, kwargs))

    async def _watch(self, run: _Running, limit_s: float | None,
                     grace_s: float) -> tuple[Stop | None, bool]:
        """Wait for the handler's call to end; (why it was stopped, if it was; whether it
        is stuck). Cancelled, it is told (``current_task().cancelled``; a coroutine is
        cancelled; a Ray task gets ray.cancel), then stopped by force after ``grace_s``;
        past ``limit_s`` it is told and stopped by force at once. A call that has not
        returned ``stuck_after_s(grace_s)`` after that is stuck."""
        call = run.call
        await asyncio.wait({call, run.told}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        if call.done():
            return None, False
        stop = Stop.CANCELLED if run.told.done() else Stop.TIMED_OUT
        log.info("consumer %d stops task %s (%s)", self.index, run.held.message.id, stop.value)
        self._tell(run)
        forced_s = forced_after_s(stop, grace_s)
        if forced_s > 0:
            await asyncio.wait({call}, timeout=forced_s)
        if not call.done():
            self._force(run)
            await asyncio.wait({call}, timeout=stuck_after_s(grace_s))
        if call.done():
            if not call.cancelled():
                call.exception()  # retrieved: the stop decides the outcome
            return stop, False
        if run.ray_call is not None:
            call.cancel()  # a Ray task holds nothing here: stop waiting for it
            return stop, False
        return stop, True

    @staticmethod
    def _tell(run: _Running) -> None:
        """Tell a handler to stop: its context says cancelled; a coroutine is cancelled; a
        Ray task gets ray.cancel (KeyboardInterrupt in it)."""
        run.context.cancelled = True
        if run.ray_call is not None and run.ref is not None:
            run.ray_call.cancel(run.ref, force=False)
        elif run.thread is None:
            run.call.cancel()  # a coroutine (or a Ray task not launched yet)

    @staticmethod
    def _force(run: _Running) -> None:
        """Stop a handler by force: HandlerStopped raised in its thread, its Ray task's
        worker killed (ray.cancel force), its coroutine cancelled again."""
        if run.ray_call is not None and run.ref is not None:
            run.ray_call.cancel(run.ref, force=True)
        elif not run.raise_in_thread():
            run.call.cancel()

    def _restart(self, m: StoredMessage) -> None:
        """Leave the process: a handler's thread did not return after it was stopped by
        force, and only a new process frees it. Ray starts the consumer again; the tasks
        it held reappear for other consumers once their visibility lapses (at-least-once)."""
        log.error("consumer %d restarts: the handler of task %s (%s) did not stop",
                  self.index, m.id, m.type)
        logging.shutdown()
        os._exit(1)

    def _beat_later(self, run: _Running, spec: TaskSpec, lease: str, first: bool = False) -> None:
        """The task's next heartbeat, a third of the visibility timeout from now (the
        ``first``: from when it was received or last extended while it waited for its
        turn): a timer while the handler runs, a task only while a heartbeat is under way."""
        beat_s = self.consumer_config.visibility_timeout_s / 3
        if first:
            beat_s = max(0.0, run.held.renewed_at + beat_s - self.clock.monotonic())
        run.beat = asyncio.get_running_loop().call_later(beat_s, self._beat, run, spec, lease)

    def _beat(self, run: _Running, spec: TaskSpec, lease: str) -> None:
        run.beating = asyncio.get_running_loop().create_task(self._heartbeat(run, spec, lease))

    async def _heartbeat(self, run: _Running, spec: TaskSpec, lease: str) -> None:
        """Hide the task longer, renew its concurrency lease, and plan the next heartbeat;
        a heartbeat that fails plans none (whoever holds the task now finishes it)."""
        try:
            await self._extend(run)
            if spec.concurrency:
                await call_async(lambda: self.manager.renew.remote(
                    run.held.message.type, lease, self.consumer_config.visibility_timeout_s))
        except (RayqError, ray.exceptions.RayError):
            return
        finally:
            run.beating = None
        if self._running.get(run.held.message.id) is run:  # still running: beat again later
            self._beat_later(run, spec, lease)

    async def _extend(self, run: _Running) -> None:
        """Hide the task longer (its new receipt kept) and learn whether it was cancelled
        (the shard keeps the cancel: told here even when a look_for_cancel was missed)."""
        held = run.held
        async with held.extending:
            renewed_at = self.clock.monotonic()
            receipt, cancelled = await held.ends.call(
                Extend(held.receipt, self.consumer_config.visibility_timeout_s))
            held.receipt, held.renewed_at = receipt, renewed_at
        if cancelled:
            run.tell()

    async def _end(self, held: _Held, spec: TaskSpec, called: _Called, usage_s: float,
                   wait_s: float) -> None:
        """Delete a finished task, retry a failed one later, dead-letter a failed last
        try, end a cancelled one (:func:`rayq.core.consumers.decisions.decide_end` and
        :func:`~rayq.core.consumers.decisions.stopped_end` decide which)."""
        m, queue = held.message, held.queue
        if called.stop is not None:
            end = stopped_end(called.stop, m.dequeue_count, spec, queue.max_receives,
                              self.consumer_config, random.random())
        else:
            end = decide_end(called.ok, m.dequeue_count, spec, queue.max_receives,
                             self.consumer_config, called.retriable, random.random())
        dead_letter = queue.dead_letter_on(queue.subqueue(m.subqueue).shard)
        await self._ended(held, end, end.write(held.receipt, called.outcome, dead_letter),
                          usage_s, wait_s)

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
