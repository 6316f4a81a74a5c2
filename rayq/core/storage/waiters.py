"""Calls waiting for task outcomes (the ObjectRefs of ``client.submit``) on an outcome
desk (``actors/outcomes.py``), which its shard tells of every end it records, and what
each resolves to.

A waiter registers before it looks, so an end told between the look and the wait still
wakes it. The first look is at the ends told lately (no call to the shard); the shard's
table is read only when a wait outlasts ``recheck_s`` without news, which covers ends
told while the desk was restarting, or by a leader that died right after its commit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import decode_outcome
from rayq.errors import OutcomeLost, TaskCancelled, TaskError

Outcome = tuple[Ending, bytes]
Found = Outcome | bool  # an outcome, or False: no copy of the task is left (never True)
# Ends a desk keeps for waits that register after they were told: the latest this many,
# holding at most this many payload bytes (an older one is read from the shard).
RECENT_KEPT = 50_000
RECENT_KEPT_BYTES = 64 << 20
_ENDINGS = {Ending.DEAD: ("DeadLettered", "the task was delivered max_receives times "
                                          "without finishing and is in the dead-letter queue"),
            Ending.EXPIRED: ("Expired", "the task's time to live ran out before it ran"),
            Ending.DELETED: ("Deleted", "the task was deleted or cleared before it finished")}


def outcome_value(ending: Ending, payload: bytes) -> Any:
    """What a task's ref resolves to: its handler's value, or TaskError (the handler's
    error, or why the task ended without a result: TaskCancelled when it was cancelled)."""
    if ending is Ending.RESULT:
        return decode_outcome(payload)
    if ending is Ending.CANCELLED:
        raise TaskCancelled()
    raise TaskError(*_ENDINGS[ending])


def found_value(found: Found) -> Any:
    """:func:`outcome_value` of what a wait found; OutcomeLost for a task with no copy left."""
    if found is False:
        raise OutcomeLost("no copy of this task or of its outcome is left on its shard")
    return outcome_value(*found)


class OutcomeWaiters:
    """``read(ids)`` reads the durable outcomes of ``ids`` (None for each not ended,
    False for one no copy of is left). A wait looks first at the ends it was told of
    (:meth:`notify`) lately, then reads after each ``recheck_s`` without news."""

    def __init__(self, read: Callable[[list[str]], Awaitable[list[Found | None]]],
                 recheck_s: float):
        self._read, self._recheck_s = read, recheck_s
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self._lock = threading.Lock()
        self._recent: dict[str, Outcome] = {}  # the latest ends told, oldest first
        self._recent_bytes = 0

    async def wait(self, message_ids: list[str]) -> list[Found]:
        """How each task ended, waiting for those that have not: a look at the ends told
        lately, then the wake-ups their ends send, and a read of all after each
        ``recheck_s`` without news."""
        loop = asyncio.get_running_loop()
        found: dict[str, Found] = {}
        first = True
        while len(found) < len(message_ids):
            waiting = {mid: loop.create_future() for mid in message_ids if mid not in found}
            with self._lock:  # register before reading: no wake-up is missed
                for mid, future in waiting.items():
                    self._waiters.setdefault(mid, []).append((loop, future))
            try:
                if first:
                    got = [self._recent.get(mid) for mid in waiting]
                else:
                    got = await self._read(list(waiting))
                first = False
                for mid, outcome in zip(waiting, got):
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

    def waiting(self, message_id: str) -> int:
        """How many calls wait for ``message_id`` now."""
        with self._lock:
            return len(self._waiters.get(message_id, ()))

    def notify(self, finished: list[tuple[str, Ending | None, bytes]]) -> None:
        """Hand each recorded outcome to the calls waiting for it (on their own loop). An
        ending None is an end forgotten (the task was redriven: it runs again): the end
        kept for it goes, and its waits go on waiting."""
        self._remember(finished)
        for message_id, ending, payload in finished:
            if ending is None:
                continue
            with self._lock:
                waiters = self._waiters.pop(message_id, [])
            for loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, (ending, payload))

    def _remember(self, finished: list[tuple[str, Ending | None, bytes]]) -> None:
        """Keep the latest ends told, within RECENT_KEPT and RECENT_KEPT_BYTES, oldest
        dropped first (dicts keep their order); an end forgotten drops the one kept."""
        recent = self._recent
        for message_id, ending, payload in finished:
            if ending is None:
                if message_id in recent:
                    self._recent_bytes -= len(recent.pop(message_id)[1])
            elif message_id not in recent:
                recent[message_id] = (ending, payload)
                self._recent_bytes += len(payload)
        while recent and (len(recent) > RECENT_KEPT or self._recent_bytes > RECENT_KEPT_BYTES):
            self._recent_bytes -= len(recent.pop(next(iter(recent)))[1])

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
