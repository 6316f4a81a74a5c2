"""Reports served from one long-lived process: what the analytics actor
(actors/analytics.py) runs. It keeps a :class:`~rayq.analytics.warm.WarmSpark`
between reports and retires (stops Spark, then calls ``exit``) after
``AnalyticsConfig.idle_stop_s`` without a report, or after Spark failed, so an idle
runtime holds no JVM and no executor's CPU. RayDP cannot start Spark twice in one
process: after retiring, the next report needs a fresh process.

Each report is made in a temporary folder of this process and returned as its files'
bytes (:class:`~rayq.analytics.report.ReportFiles`), for the caller to write where
it runs. Where the events come from is :meth:`ReportService.gather`'s to say: here
one local events folder; the analytics actor reads every data node's, on its node.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rayq.analytics.report import ReportFiles, pack
from rayq.analytics.sources import NewEvents, local_events
from rayq.analytics.warm import WarmSpark
from rayq.config import AnalyticsConfig
from rayq.core.kit.clock import Clock, SystemClock
from rayq.errors import RuntimeFailure

POLL_S = 0.5          # how often a waiting client asks for the steps done
RETIRE_AFTER_S = 1.0  # a failed report's answer leaves before the process exits
WATCH_MAX_S = 30.0    # the idle check runs at least this often


@dataclass(frozen=True)
class AnalyticsStats:
    """spark: Spark runs; reports: served; events: held in Spark; idle_s: since the
    last report ended (or the service started); retiring: Spark is being stopped."""

    spark: bool
    reports: int
    events: int
    idle_s: float
    retiring: bool


class ReportService:
    """Reports one at a time on a warm Spark; ``steps`` answers while one runs.
    ``exit()`` ends the process once retired (an actor kills itself)."""

    def __init__(self, config: AnalyticsConfig, clock: Clock = SystemClock(),
                 watch: bool = True, warm: str | None = None):
        self._warm, self._clock = WarmSpark(config), clock
        self._idle_stop_s = config.idle_stop_s
        self._lock = threading.Lock()      # one report at a time
        self._steps: list[str] = []
        self._since = clock.monotonic()
        self._retiring = False
        if watch and self._idle_stop_s > 0:
            threading.Thread(target=self._watch, daemon=True).start()
        if warm:  # where the events are: Spark starts now, on a thread of its own
            threading.Thread(target=self.warm_up, args=(warm,), daemon=True).start()

    def report(self, where: str, window_s: float, current: Mapping[str, float]) -> ReportFiles:
        """One report (``WarmSpark.report``) over the events :meth:`gather` finds from
        ``where``, returned as its files; Spark logs under :meth:`log_dir`."""
        with self._lock:
            while self._retiring:   # wait for the exit: the caller then asks a fresh one
                time.sleep(POLL_S)
            self._steps = []
            out_dir = tempfile.mkdtemp(prefix="rayq-report-")
            try:
                made = self._warm.report(lambda known, window: self.gather(where, known, window),
                                         out_dir,
                                         window_s, self._steps.append, current,
                                         self.log_dir(where))
                return pack(made, out_dir)
            except RuntimeFailure:
                self._retire(RETIRE_AFTER_S)  # Spark may be broken: the next report starts anew
                raise
            finally:
                shutil.rmtree(out_dir, ignore_errors=True)
                self._since = self._clock.monotonic()

    def gather(self, where: str, known: frozenset[str], window_s: float) -> NewEvents:
        """The events of the files not in ``known``, aggregated for windows of
        ``window_s``: here those of the events folder ``where``, read by this process."""
        return local_events(where, known, window_s)

    def log_dir(self, where: str) -> str:
        """Spark logs in ``<data_dir>/spark``, beside the event log ``where``."""
        return os.path.join(os.path.dirname(os.path.abspath(where)), "spark")

    def warm_up(self, where: str) -> None:
        """Start Spark before the first report (``rayq start --warm-report``)."""
        with self._lock:
            if not self._retiring:
                self._warm.start(self.log_dir(where))
            self._since = self._clock.monotonic()

    def steps(self, since: int = 0) -> list[str]:
        """The steps of the report running (or last run), from ``since`` on."""
        return self._steps[since:]

    def stats(self) -> AnalyticsStats:
        return AnalyticsStats(self._warm.running, self._warm.reports, self._warm.held,
                              self._clock.monotonic() - self._since, self._retiring)

    def retire_if_idle(self) -> bool:
        """Retire when Spark runs and no report came for ``idle_stop_s``; returns
        whether it did. A report running now keeps it."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            idle_s = self._clock.monotonic() - self._since
            if self._warm.running and not self._retiring and 0 < self._idle_stop_s <= idle_s:
                self._retire(0.0)
                return True
            return False
        finally:
            self._lock.release()

    def exit(self) -> None:
        """End the process (the actor overrides this); here: nothing."""

    def _watch(self) -> None:
        while not self._retiring:
            time.sleep(min(WATCH_MAX_S, self._idle_stop_s / 4))
            self.retire_if_idle()

    def _retire(self, delay_s: float) -> None:
        """Stop Spark, then :meth:`exit`, after ``delay_s``, on a thread of its own."""
        self._retiring = True

        def stop() -> None:
            time.sleep(delay_s)
            try:
                self._warm.stop()
            finally:
                self.exit()
        threading.Thread(target=stop, daemon=True).start()


def follow(start: Callable[[], object], done: Callable[[object], bool],
           steps: Callable[[int], list[str]], answer: Callable[[object], object],
           progress: Callable[[str], None]):
    """Start a report (``start()`` returns what ``done`` and ``answer`` take), pass on
    its ``steps(since)`` to ``progress`` while it runs, then return ``answer``."""
    pending, seen = start(), 0
    while True:
        finished = done(pending)
        for step in steps(seen):
            progress(step)
            seen += 1
        if finished:
            return answer(pending)
