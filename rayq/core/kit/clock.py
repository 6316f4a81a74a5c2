"""Injected time: components read a :class:`Clock`, never the wall clock directly."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (timestamps that are stored)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go backwards (intervals)."""


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to, so tests never sleep."""

    def __init__(self, start: float = 1_700_000_000.0):
        self._now = float(start)
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a FakeClock only moves forward")
        self._now += seconds
        self._mono += seconds
