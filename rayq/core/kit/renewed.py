"""Values kept for a time to live, and read again when they grow old.

:class:`Renewed` is the bookkeeping (the caller reads and says when): :meth:`Renewed.get`
answers a value and whether to start a renewal in the background (past half the time
to live, so a value in use is never waited for); :meth:`Renewed.keep` takes a read's
value unless a later read, or a change (:meth:`Renewed.changed`), came after the read
began.

:class:`Refreshed` is one value read again in the foreground over that bookkeeping: when
it is older than its time to live, or on demand (a request the copy could not answer)
at most once a gap; callers that come while a read is under way share it, and a read
begun before :meth:`Refreshed.forget` is not trusted. The gates' directory and the SQS
endpoint's account keys are kept so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from rayq.core.kit.clock import Clock

MISSING = object()  # get(): nothing kept, or kept too long ago: read it now
T = TypeVar("T")


class Renewed:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._kept: dict[Hashable, tuple[float, Any]] = {}   # name -> (read at, value)
        self._changed_at: dict[Hashable, float] = {}
        self._renewing: set[Hashable] = set()

    def get(self, name: Hashable, now: float) -> tuple[Any, bool]:
        """(the value, or MISSING; whether to renew it in the background now). A renewal
        asked for is under way until :meth:`renewed`."""
        value = self.kept(name, now)
        if value is MISSING:
            return MISSING, False
        renew = now - self._kept[name][0] > self.ttl_s / 2 and name not in self._renewing
        if renew:
            self._renewing.add(name)
        return value, renew

    def kept(self, name: Hashable, now: float) -> Any:
        """The value read less than ``ttl_s`` before ``now``, or MISSING; asks for no
        renewal."""
        kept = self._kept.get(name)
        if kept is None or now - kept[0] >= self.ttl_s:
            return MISSING
        return kept[1]

    def read_at(self, name: Hashable) -> float | None:
        """When the read of the value kept began (None: nothing kept)."""
        kept = self._kept.get(name)
        return None if kept is None else kept[0]

    def keep(self, name: Hashable, read_at: float, value: Any) -> Any:
        """Keep ``value``, read from ``read_at`` on, unless something newer is known;
        returns it."""
        kept = self._kept.get(name)
        if (kept is None or kept[0] <= read_at) and self._changed_at.get(name, -1.0) <= read_at:
            self._kept[name] = (read_at, value)
        return value

    def renewed(self, name: Hashable) -> None:
        """The background renewal of ``name`` ended (kept or failed)."""
        self._renewing.discard(name)

    def changed(self, name: Hashable, now: float) -> None:
        """``name`` changed at ``now``: reads begun before are stale."""
        self._kept.pop(name, None)
        self._changed_at[name] = now


class Refreshed(Generic[T]):
    """One value, read with ``read`` (awaited on the caller's event loop) when
    :meth:`fresh` finds it older than ``max_age_s``, or when asked to (``force``: at
    most once every ``min_gap_s``, the caller waiting out the rest of the gap)."""

    _NAME = "value"

    def __init__(self, read: Callable[[], Awaitable[T]], initial: T, clock: Clock, *,
                 max_age_s: float, min_gap_s: float):
        self._read, self.clock, self.min_gap_s = read, clock, min_gap_s
        self._kept = Renewed(max_age_s)
        self.value: T = initial  # the last value kept: stays through forget() until a read
        self._reads_ended = 0
        self._forgets = 0
        self._lock = asyncio.Lock()

    async def fresh(self, force: bool = False) -> bool:
        """Read the value again when it is due (or ``force``); returns whether a read
        ended during this call (its own or one it shared): the value may have changed.
        Reads are one at a time; a caller that finds one under way waits for it and
        reads no more unless it was not kept (a :meth:`forget` came during it)."""
        asked = self.clock.monotonic()
        if not force and self._kept.kept(self._NAME, asked) is not MISSING:
            return False
        ended = self._reads_ended
        last = self._kept.read_at(self._NAME)
        if force and last is not None and last + self.min_gap_s > asked:
            await asyncio.sleep(last + self.min_gap_s - asked)
        async with self._lock:
            while (self._reads_ended == ended
                   or self._kept.kept(self._NAME, self.clock.monotonic()) is MISSING):
                began, forgets = self.clock.monotonic(), self._forgets
                try:
                    value = await self._read()
                finally:
                    self._reads_ended += 1
                if forgets == self._forgets:  # else read before a change: read again
                    self.value = self._kept.keep(self._NAME, began, value)
        return True

    def forget(self) -> None:
        """The value changed at its source: the next :meth:`fresh` reads it, and a read
        under way now is not kept."""
        self._forgets += 1  # counted, not timed: a fake clock may not move in between
        self._kept.changed(self._NAME, self.clock.monotonic())
