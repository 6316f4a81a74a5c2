"""Ray metrics (``ray.util.metrics``, exported by Ray's metrics agent) of the runtime.

Tags are bounded: shard index, and at most TOP_KEYS fairness keys or tenants
per metric with the rest summed under "other" (:func:`rayq.core.kit.metrics.top_keys`).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import sys
from collections.abc import Awaitable, Callable

import ray
from ray.util.metrics import Counter, Gauge

from rayq.core.kit.metrics import failure_text, per_key, top_keys
from rayq.errors import RayqError


class ShardMetrics:
    def __init__(self, index: int):
        tags = {"shard": str(index)}
        self.messages = Gauge("rayq_shard_messages", "Messages stored on the shard", ("shard",))
        self.cache_bytes = Gauge("rayq_cache_bytes", "Bytes in the shard's message cache", ("shard",))
        self.pressure = Gauge("rayq_cache_pressure", "1 while the shard is under memory pressure",
                              ("shard",))
        self.depth = Gauge("rayq_key_depth", "Messages per fairness key", ("shard", "key"))
        self.oldest = Gauge("rayq_key_oldest_age_s", "Wait of the oldest visible message per key",
                            ("shard", "key"))
        for metric in (self.messages, self.cache_bytes, self.pressure, self.depth, self.oldest):
            metric.set_default_tags(tags)

    def update(self, stats, depths) -> None:
        self.messages.set(stats.messages)
        self.cache_bytes.set(stats.cache.bytes)
        self.pressure.set(float(stats.cache.under_pressure))
        depth, oldest = per_key(depths)
        for key, n in top_keys(depth).items():
            self.depth.set(n, {"key": key})
        for key, age in top_keys(oldest).items():
            self.oldest.set(age, {"key": key})


class CoordinatorMetrics:
    def __init__(self):
        self.intervening = Gauge("rayq_fairness_intervening", "1 while fairness intervenes")
        self.interventions = Counter("rayq_fairness_interventions_total", "Interventions started")
        self.victims = Gauge("rayq_fairness_victims", "Keys both latency and usage victims")
        self.usage = Gauge("rayq_key_usage_s", "Handler seconds per key in the look-back", ("key",))
        self.redeliveries = Counter("rayq_redeliveries_total", "Deliveries after the first")

    def decided(self, decision, started: bool, usage: dict[str, float]) -> None:
        self.intervening.set(float(decision.intervening))
        self.victims.set(len(decision.victims))
        if started:
            self.interventions.inc()
        for key, seconds in top_keys(usage).items():
            self.usage.set(seconds, {"key": key})

    def reported(self, report) -> None:
        if report.attempt > 1:
            self.redeliveries.inc()


class FloodMetrics:
    def __init__(self):
        self.flooders = Gauge("rayq_flooders", "Entries on the flooder list")
        self.spilled = Gauge("rayq_spilled_messages", "Flooders' messages in spill stores")

    def update(self, flooders) -> None:
        self.flooders.set(len(flooders))
        self.spilled.set(sum(f.spilled for f in flooders))


class BackgroundFailures:
    """Failures of an actor's background loops (housekeeping, scaling, evaluation,
    polling): each is logged with its cause and counted, per loop and in the
    ``rayq_background_failures_total`` metric, so a failure that persists shows up
    instead of being retried in silence."""

    def __init__(self, component: str, index: int | None = None):
        self.name = component if index is None else f"{component} {index}"
        self.log = logging.getLogger(f"rayq.{component}")
        self.counts: collections.Counter[str] = collections.Counter()
        self.metric = Counter("rayq_background_failures_total",
                              "Failed rounds of background loops", ("component", "loop"))
        self.metric.set_default_tags({"component": self.name})

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    async def every(self, interval_s: float, loop: str, step: Callable[[], Awaitable],
                    first_s: float | None = None) -> None:
        """Run ``step`` every ``interval_s`` seconds for ever (see :meth:`guarded`), the
        first time after ``first_s`` (default: ``interval_s``)."""
        await asyncio.sleep(interval_s if first_s is None else first_s)
        while True:
            await self.guarded(loop, step)
            await asyncio.sleep(interval_s)

    async def paced(self, loop: str, step: Callable[[], Awaitable],
                    pause_s: Callable[[], float]) -> None:
        """Run ``step`` for ever (see :meth:`guarded`), each time after a wait of
        ``pause_s()`` seconds."""
        while True:
            await asyncio.sleep(pause_s())
            await self.guarded(loop, step)

    async def guarded(self, loop: str, step: Callable[[], Awaitable],
                      also: tuple[type[Exception], ...] = ()) -> None:
        """Run one round of a background loop. A rayq or Ray error (a peer restarting,
        an overloaded shard) is recorded, and the next round tries again; anything else
        is a bug, logged with its traceback, that must not stop the loop for good.
        ``also``: more errors to record as expected."""
        try:
            await step()
        except (RayqError, ray.exceptions.RayError, *also) as err:
            self.record(loop, err)
        except Exception:
            self.log.exception("%s: %s failed", self.name, loop)

    def record(self, loop: str, err: BaseException) -> None:
        self.counts[loop] += 1
        self.metric.inc(tags={"loop": loop})
        self.log.warning("%s: %s failed (%d so far), retrying next round: %s", self.name, loop,
                         self.counts[loop], failure_text(err))


try:
    _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc: the heap stays as the allocator keeps it
    _malloc_trim = None


def trim_heap() -> None:
    """Give free heap pages back to the system: glibc's (it keeps them otherwise: after
    a burst of puts the shard's freed message buffers stay resident, about 80 MiB of
    private memory after 1 000 000 messages went through) and Arrow's pool (the event
    log's columns)."""
    if _malloc_trim is not None:
        _malloc_trim(0)
    pyarrow = sys.modules.get("pyarrow")  # a process that never loaded it has no pool
    if pyarrow is not None:
        pyarrow.default_memory_pool().release_unused()
