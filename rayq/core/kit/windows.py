"""A fixed circular array of time windows of per-key sums.

Used for enqueue counts per (type, tenant) in the shards and, later, usage per
key in the fairness coordinator. Memory is ``windows`` slots per key whatever
the traffic; old slots are reset as time moves past them.
"""

from __future__ import annotations

from collections.abc import Hashable


class WindowedSums:
    """Per-key sums over the last ``windows`` windows of ``window_s`` seconds."""

    def __init__(self, window_s: float, windows: int):
        if window_s <= 0 or windows < 1:
            raise ValueError("window_s must be > 0 and windows >= 1")
        self.window_s = float(window_s)
        self.windows = int(windows)
        self._sums: dict[Hashable, list[float]] = {}
        self._epochs: dict[Hashable, list[int]] = {}

    def epoch(self, now: float) -> int:
        """The index of the window ``now`` falls in."""
        return int(now // self.window_s)

    def add(self, key: Hashable, amount: float, now: float) -> None:
        epoch = self.epoch(now)
        slot = epoch % self.windows
        sums = self._sums.get(key)
        if sums is None:
            sums = self._sums[key] = [0.0] * self.windows
            self._epochs[key] = [-1] * self.windows
        epochs = self._epochs[key]
        if epochs[slot] != epoch:
            epochs[slot], sums[slot] = epoch, 0.0
        sums[slot] += amount

    def series(self, key: Hashable, now: float) -> list[float]:
        """Sums per window, oldest first, the last entry being the current window."""
        current = self.epoch(now)
        sums, epochs = self._sums.get(key), self._epochs.get(key)
        out = []
        for epoch in range(current - self.windows + 1, current + 1):
            slot = epoch % self.windows
            out.append(sums[slot] if sums and epochs[slot] == epoch else 0.0)
        return out

    def total(self, key: Hashable, now: float, last: int | None = None) -> float:
        """Sum over the look-back, or over the ``last`` most recent windows."""
        series = self.series(key, now)
        return sum(series[-last:] if last else series)

    def keys(self) -> list[Hashable]:
        return list(self._sums)

    def snapshot(self, now: float) -> dict[Hashable, list[float]]:
        """Every key with a non-zero sum in the look-back, mapped to its series."""
        out = {}
        for key in list(self._sums):
            series = self.series(key, now)
            if any(series):
                out[key] = series
            else:  # forget keys that fell out of the look-back
                del self._sums[key], self._epochs[key]
        return out
