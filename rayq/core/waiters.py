"""Calls waiting for task outcomes (``wait_outcome``, the ObjectRef of ``client.submit``).

A waiter registers before it reads the outcomes table, so an outcome recorded
between its read and its wait still wakes it. Waiters may sit on other event loops
(a shard runs them in their own concurrency group) than the one that records
outcomes: they are woken thread-safely, on their own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

from rayq.core.model import Ending
from rayq.core.tasks import decode_outcome
from rayq.errors import TaskError

_ENDINGS = {Ending.DEAD: ("DeadLettered", "the task was delivered max_receives times "
                                          "without finishing and is in the dead-letter queue"),
            Ending.EXPIRED: ("Expired", "the task's time to live ran out before it ran"),
            Ending.DELETED: ("Deleted", "the task was deleted or cleared before it finished")}


def outcome_value(ending: Ending, payload: bytes) -> Any:
    """What a task's ref resolves to: its handler's value, or TaskError (the handler's
    error, or why the task ended without a result)."""
    if ending is Ending.RESULT:
        return decode_outcome(payload)
    raise TaskError(*_ENDINGS[ending])


class OutcomeWaiters:
    """Futures waiting for the outcome of a message, by message id."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}

    def register(self, message_id: str) -> asyncio.Future:
        """A future on the running loop that :meth:`notify` settles with
        (ending, payload) when the message's outcome is recorded."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            self._waiting.setdefault(message_id, []).append((loop, future))
        return future

    @staticmethod
    async def wait(future: asyncio.Future, timeout_s: float) -> tuple[Ending, bytes] | None:
        """The outcome ``future`` was settled with, or None after ``timeout_s``."""
        await asyncio.wait([future], timeout=timeout_s)
        return future.result() if future.done() else None

    def notify(self, finished: Iterable[tuple[str, Ending, bytes]]) -> None:
        """Hand each recorded (message id, ending, payload) to its waiters (any thread)."""
        for message_id, ending, payload in finished:
            with self._lock:
                waiters = self._waiting.pop(message_id, [])
            for loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, (ending, payload))

    def forget(self, message_id: str, future: asyncio.Future) -> None:
        """Stop waiting with ``future`` (settled, timed out or cancelled)."""
        with self._lock:
            left = [w for w in self._waiting.pop(message_id, []) if w[1] is not future]
            if left:
                self._waiting[message_id] = left

    def __len__(self) -> int:
        """Message ids with waiters."""
        return len(self._waiting)


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():  # cancelled, or given up on meanwhile
        future.set_result(value)
