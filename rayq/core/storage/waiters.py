"""Calls waiting for task outcomes (``wait_outcome``, ``wait_outcomes``: the ObjectRefs of
``client.submit``), on the shard's outcome loop, and what each resolves to.

A waiter registers before it reads the outcomes table, so an end recorded between
the read and the wait still wakes it. Ends are recorded on the store thread and
handed to the waiters' own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import decode_outcome
from rayq.errors import TaskError

Outcome = tuple[Ending, bytes]
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
    """``read(ids)`` reads the durable outcomes of ``ids`` (None for each not ended);
    waiters re-read every ``recheck_s`` whatever they were told."""

    def __init__(self, read: Callable[[list[str]], Awaitable[list[Outcome | None]]],
                 recheck_s: float):
        self._read, self._recheck_s = read, recheck_s
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self._lock = threading.Lock()

    async def wait(self, message_ids: list[str]) -> list[Outcome]:
        """How each task ended, waiting for those that have not: one read for all, then
        the wake-ups their ends send."""
        loop = asyncio.get_running_loop()
        found: dict[str, Outcome] = {}
        while len(found) < len(message_ids):
            waiting = {mid: loop.create_future() for mid in message_ids if mid not in found}
            with self._lock:  # register before reading: no wake-up is missed
                for mid, future in waiting.items():
                    self._waiters.setdefault(mid, []).append((loop, future))
            try:
                for mid, outcome in zip(waiting, await self._read(list(waiting))):
                    if outcome is not None:
                        found[mid] = outcome
                await self._woken(waiting, found)
            finally:
                for mid, future in waiting.items():
                    self._forget(mid, future)
        return [found[mid] for mid in message_ids]

    async def _woken(self, waiting: dict[str, asyncio.Future], found: dict[str, Outcome]) -> None:
        """Collect wake-ups into ``found`` until all came or ``recheck_s`` passed with none."""
        pending = {future: mid for mid, future in waiting.items() if mid not in found}
        while pending:
            done, _ = await asyncio.wait(pending, timeout=self._recheck_s)
            if not done:
                return  # read the table again
            for future in done:
                found[pending.pop(future)] = future.result()

    def notify(self, finished: list[tuple[str, Ending, bytes]]) -> None:
        """Hand each recorded outcome to the calls waiting for it (on their own loop)."""
        for message_id, ending, payload in finished:
            with self._lock:
                waiters = self._waiters.pop(message_id, [])
            for loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, (ending, payload))

    def _forget(self, message_id: str, future: asyncio.Future) -> None:
        with self._lock:
            waiters = self._waiters.get(message_id)
            if waiters is None:
                return
            waiters[:] = [w for w in waiters if w[1] is not future]
            if not waiters:
                del self._waiters[message_id]


def _settle(future: asyncio.Future, value: Outcome) -> None:
    if not future.done():
        future.set_result(value)
