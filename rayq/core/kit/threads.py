"""Threads that run blocking calls for one asyncio event loop, each call's result handed
back on an asyncio future.

``loop.run_in_executor`` with a ThreadPoolExecutor makes, per call, a
``concurrent.futures.Future`` (a Condition and its RLock), a work item, and an asyncio
future chained to it by callbacks on both sides. A consumer hands every handler call
of a sync task to a thread, so that machinery was a quarter of its CPU for tiny tasks.
Here a call is a tuple on a SimpleQueue, and its thread settles the asyncio future with
one ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # its waiter was cancelled meanwhile
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class CallThreads:
    """Up to ``max_threads`` daemon threads, started when a call finds none idle."""

    def __init__(self, max_threads: int, name: str):
        if max_threads < 1:
            raise ValueError("CallThreads needs max_threads >= 1")
        self._max, self._name = max_threads, name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._idle = 0  # started; idle and waiting for a call

    @property
    def started(self) -> int:
        """Threads started so far."""
        return self._threads

    def run(self, fn: Callable[[], Any]) -> asyncio.Future:
        """``fn()`` on one of the threads; its value (or its exception, any BaseException)
        on the future, which belongs to the running event loop."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._idle:
                self._idle -= 1
                start = False
            else:
                start = self._threads < self._max
                self._threads += start
        self._calls.put((fn, loop, future))
        if start:
            threading.Thread(target=self._work, daemon=True,
                             name=f"{self._name}-{self._threads}").start()
        return future

    def _work(self) -> None:
        calls = self._calls
        while True:
            fn, loop, future = calls.get()
            try:
                result, error = fn(), None
            except BaseException as err:  # noqa: BLE001 - the caller's to see, as the pool's
                result, error = None, err
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # its loop closed: nobody waits any more
                pass
            del fn, loop, future, result, error  # hold nothing while idle
            with self._lock:
                self._idle += 1
