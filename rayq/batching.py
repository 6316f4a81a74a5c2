"""The waiting half of group commit: a :class:`~rayq.core.kit.batcher.Batcher` (the policy)
driven from threads or from one asyncio event loop.

A call's result is handed back as a value; an exception is a value too (a store call
that raised, or the flush's failure) and the waiting caller raises it. No Ray here:
the flush is handed in.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rayq.core.kit.batcher import Batch, Batcher


MAX_LINGER_S = 0.001  # a thread leader waits at most this long for callers just answered


class _Slot:
    __slots__ = ("wake", "lead", "done", "result")

    def __init__(self):
        self.wake = threading.Event()
        self.lead = self.done = False
        self.result: Any = None


class ThreadBatcher:
    """Callers on any thread; the first that may lead a flush runs it on its own thread
    (no thread of ours), the others wait on an Event. After its flush a leader passes
    the lead to the oldest waiting caller and returns; the new leader lingers for the
    callers the last flush answered (:meth:`Batcher.linger`).

    Each lead counts in :attr:`in_flight` until it ends, so none may be lost. A caller's
    ``lead`` flag is one lead handed to it and not yet taken; it is read, set and cleared
    only under the lock. Two leaders may pick the same oldest caller before its thread
    runs (or one may pick a caller that :meth:`Batcher.add` just told to lead): the
    second gives its lead back instead of setting the flag again. And a caller reads
    ``lead`` and ``done`` at once: read apart, a lead handed in between, to a call that
    another leader then flushed, would be skipped. Either loss would leave a lead counted
    for ever, and with ``max_in_flight`` of them no caller leads again."""

    def __init__(self, batcher: Batcher, flush: Callable[[list], list]):
        self._batcher, self._flush = batcher, flush
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._lingering = 0  # leaders waiting for callers (Batcher.linger)
        self._awaited = 0    # the fewest pending callers one of them waits for

    def __len__(self) -> int:
        """Calls waiting for a flush."""
        with self._lock:
            return len(self._batcher)

    @property
    def in_flight(self) -> int:
        """Flushes under way (see :attr:`Batcher.in_flight`)."""
        with self._lock:
            return self._batcher.in_flight

    def call(self, item: Any) -> Any:
        """Flush ``item`` with whatever else is pending; return its result or raise its
        error. The flush takes the items and returns their results."""
        slot = _Slot()
        with self._lock:
            slot.lead = self._batcher.add(item, slot)
            if self._lingering and len(self._batcher) >= self._awaited:
                self._arrived.notify_all()  # once they are there, not once per caller
        while True:  # flags are read after each wake-up is cleared: none is lost
            with self._lock:  # lead and done at once (see the class docstring)
                lead, done = slot.lead, slot.done
                slot.lead = False
            if lead:  # also when another leader already flushed this slot's call
                self._lead()
            elif done:
                break
            else:
                slot.wake.wait()
                slot.wake.clear()
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result

    def _lead(self) -> None:
        """One flush, then the lead passes on."""
        with self._lock:
            linger = self._batcher.linger(MAX_LINGER_S)
            if linger is not None:
                callers, seconds = linger
                self._awaited = min(self._awaited, callers) if self._lingering else callers
                self._lingering += 1
                try:
                    self._arrived.wait_for(lambda: len(self._batcher) >= callers, seconds)
                finally:
                    self._lingering -= 1
            batch = self._batcher.take()
        if batch is None:
            return
        started = time.monotonic()
        try:
            results = batch.results(self._flush(batch.items))
        except BaseException as err:  # every caller of this flush learns of the failure
            results = batch.failed(err)
        with self._lock:
            self._batcher.flushed(batch, time.monotonic() - started)
            for slot, result in zip(batch.waiters, results):
                slot.result, slot.done = result, True
                slot.wake.set()
            successor = self._batcher.pass_lead()
            if successor is None:
                return
            if successor.lead:  # handed a lead it has not taken yet: one flag holds one
                self._batcher.leave()
            else:
                successor.lead = True
                successor.wake.set()


class AsyncBatcher:
    """Callers on one event loop; a leader is a task of that loop, the callers await
    Futures. Build it on the loop it serves."""

    def __init__(self, batcher: Batcher, flush: Callable[[list], Awaitable[list]]):
        self._batcher, self._flush = batcher, flush
        self._loop = asyncio.get_running_loop()

    def __len__(self) -> int:
        """Calls waiting for a flush."""
        return len(self._batcher)

    def submit(self, item: Any) -> asyncio.Future:
        """Queue ``item`` for the next flush; the Future holds its result or error (as a
        value, not raised). Raises Overloaded when the batcher's pending calls are full."""
        future = self._loop.create_future()
        if self._batcher.add(item, future):
            self._loop.create_task(self._lead())
        return future

    async def call(self, item: Any) -> Any:
        """``item``'s result, or its error raised."""
        result = await self.submit(item)
        if isinstance(result, BaseException):
            raise result
        return result

    async def _lead(self) -> None:
        while (batch := self._batcher.take()) is not None:
            try:
                results = batch.results(await self._flush(batch.items))
            except Exception as err:  # every caller of this flush learns of the failure
                results = batch.failed(err)
            except BaseException:  # cancelled (the loop is closing): callers stop waiting
                _cancel(batch)
                self._batcher.leave()
                raise
            for future, result in zip(batch.waiters, results):
                if not future.done():
                    future.set_result(result)


def _cancel(batch: Batch) -> None:
    for future in batch.waiters:
        future.cancel()
