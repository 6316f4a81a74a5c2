"""The memory-pressure-aware message cache of a shard (docs/shards-and-storage.md).

Every message is written to LMDB first; while there is no memory pressure it is
also kept here so that receive need not read and decode it again. Under
pressure (the cache over its byte budget, the process over its memory limit or
the machine short of available memory) new messages skip the cache and
receive falls back to LMDB.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psutil

from rayq.core.kit.clock import Clock

# Per-entry overhead of the dict slot, key and tuple, so the budget counts real memory.
ENTRY_OVERHEAD_BYTES = 200


@dataclass(frozen=True)
class MemoryReading:
    process_rss_bytes: int
    available_bytes: int


def psutil_probe() -> MemoryReading:
    return MemoryReading(psutil.Process().memory_info().rss, psutil.virtual_memory().available)


@dataclass(frozen=True)
class CacheStats:
    """Counters of one shard's cache.

    entries/bytes: what the cache holds now; hits/misses: receives served from
    memory or from LMDB; bypasses: puts that skipped the cache because of
    pressure; pressure_episodes: transitions into pressure; under_pressure: now.
    """

    entries: int
    bytes: int
    budget_bytes: int
    hits: int
    misses: int
    bypasses: int
    pressure_episodes: int
    under_pressure: bool


class PressureMonitor:
    """Decides whether the shard is under memory pressure, reading memory sparingly."""

    def __init__(self, clock: Clock, *, budget_bytes: int, process_limit_bytes: int | None,
                 min_available_bytes: int, check_interval_s: float,
                 probe: Callable[[], MemoryReading] = psutil_probe):
        self._clock = clock
        self.budget_bytes = budget_bytes
        self._process_limit = process_limit_bytes
        self._min_available = min_available_bytes
        self._interval = check_interval_s
        self._probe = probe
        self._next_check = float("-inf")
        self._system_pressure = False

    def under_pressure(self, cache_bytes: int) -> bool:
        if cache_bytes >= self.budget_bytes:
            return True
        now = self._clock.monotonic()
        if now >= self._next_check:  # psutil costs microseconds: not on every put
            self._next_check = now + self._interval
            reading = self._probe()
            over_limit = (self._process_limit is not None
                          and reading.process_rss_bytes > self._process_limit)
            self._system_pressure = over_limit or reading.available_bytes < self._min_available
        return self._system_pressure


class MessageCache:
    """Row key -> row value (header, names and body) for messages not yet received."""

    def __init__(self, monitor: PressureMonitor):
        self._monitor = monitor
        self._entries: dict[bytes, bytes] = {}
        self._bytes = 0
        self._hits = self._misses = self._bypasses = self._episodes = 0
        self._pressure = False

    def under_pressure(self) -> bool:
        pressure = self._monitor.under_pressure(self._bytes)
        if pressure and not self._pressure:
            self._episodes += 1
        self._pressure = pressure
        return pressure

    def add(self, row_key: bytes, value: bytes) -> bool:
        """Cache a freshly stored message unless under pressure; True when cached."""
        if self.under_pressure():
            self._bypasses += 1
            return False
        self._entries[row_key] = value
        self._bytes += len(value) + len(row_key) + ENTRY_OVERHEAD_BYTES
        return True

    def take(self, row_key: bytes) -> bytes | None:
        """Remove and return a cached row value, counting the hit or the miss."""
        value = self._entries.pop(row_key, None)
        if value is None:
            self._misses += 1
            return None
        self._hits += 1
        self._bytes -= len(value) + len(row_key) + ENTRY_OVERHEAD_BYTES
        return value

    def get(self, row_key: bytes) -> bytes | None:
        return self._entries.get(row_key)

    def discard(self, row_key: bytes) -> None:
        value = self._entries.pop(row_key, None)
        if value is not None:
            self._bytes -= len(value) + len(row_key) + ENTRY_OVERHEAD_BYTES

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def stats(self) -> CacheStats:
        return CacheStats(len(self._entries), self._bytes, self._monitor.budget_bytes,
                          self._hits, self._misses, self._bypasses, self._episodes,
                          self._pressure)
