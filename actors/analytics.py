"""The analytics actor: one per runtime (named, detached, placed on the first data
node, beside the manager), serving reports on a warm Spark
(:class:`rayq.analytics.service.ReportService`). Each report reads every data
node's new events on that node (actors/event_reads.py) and returns its page and
tables as bytes, written by the caller. The first report starts it; it exits for
good (no restart) when idle or after Spark failed, and the next report starts a
fresh one: RayDP starts Spark once per process.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import ray

from rayq.names import namespace
from actors.data_nodes import data_nodes, this_node_name
from actors.event_reads import gather_events
from actors.replication.keeper import runtime_options
from rayq.analytics.report import ReportFiles
from rayq.analytics.service import POLL_S, ReportService, follow
from rayq.config import Config
from rayq.core.control.placement import node_folder
from rayq.core.kit.clock import Clock, SystemClock
from rayq.errors import RuntimeFailure
from rayq.remote import NO_RETRY, call, named

ANALYTICS = "rayq-analytics"


class AnalyticsActor(ReportService):
    """It stands apart from the actor kit (:mod:`actors.base`): a threaded actor whose
    reports block on Spark and whose idle watch is a thread; an async method of the
    kit's would make Ray run it as an async actor."""

    def __init__(self, config: Config, warm: str | None = None):
        self.runtime = config  # set first: a warm start reads it on its own thread
        super().__init__(config.analytics, warm=warm)

    def gather(self, where: str, known: frozenset[str], window_s: float):
        """``where`` is the data directory: every data node's new events, read and
        aggregated on it."""
        return gather_events(self.runtime, where, known, window_s)

    def log_dir(self, where: str) -> str:
        """Spark logs under this node's folder: ``<data_dir>/<node>/spark``."""
        return os.path.join(node_folder(where, this_node_name()), "spark")

    def exit(self) -> None:
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


AnalyticsRemote = ray.remote(AnalyticsActor)


def analytics_actor(config: Config, warm: str | None = None):
    """The runtime's analytics actor, started unless it runs; one started here with
    ``warm`` (the data directory) starts Spark at once."""
    options = {**runtime_options(data_nodes(config)[0]), "max_concurrency": 4}  # beside the manager
    return AnalyticsRemote.options(name=ANALYTICS, max_restarts=0, **options).remote(
        config, warm=warm)


def report(config: Config, data_dir: str, progress: Callable[[str], None],
           current: Mapping[str, float]) -> ReportFiles:
    """Run a report on the analytics actor over the events of the runtime whose data
    directory is ``data_dir``, telling ``progress`` each step as it is done; returns
    its files. A report that meets the actor exiting is asked again of a fresh one."""
    try:
        return _report_on(analytics_actor(config), config, data_dir, progress, current)
    except RuntimeFailure as err:
        if not isinstance(err.__cause__, ray.exceptions.RayActorError):
            raise
    _wait_gone(ANALYTICS)
    return _report_on(analytics_actor(config), config, data_dir, progress, current)


def _report_on(handle, config: Config, data_dir: str,
               progress: Callable[[str], None], current: Mapping[str, float]):
    return follow(
        lambda: handle.report.remote(data_dir, config.analytics.window_s, current),
        lambda ref: bool(ray.wait([ref], timeout=POLL_S)[0]),
        lambda since: call(lambda: handle.steps.remote(since), NO_RETRY),
        lambda ref: call(lambda: ref, NO_RETRY), progress)


def warm_up(config: Config, data_dir: str) -> None:
    """Start the analytics actor and Spark in it, without waiting for either."""
    analytics_actor(config, warm=data_dir)


def stats():
    """The analytics actor's :class:`~rayq.analytics.service.AnalyticsStats`. Raises
    RuntimeFailure when it does not run (no report yet, or it retired)."""
    handle = named(ANALYTICS)
    return call(lambda: handle.stats.remote(), NO_RETRY)


def _wait_gone(name: str, timeout_s: float = 30.0, clock: Clock = SystemClock()) -> None:
    """Until an exited actor's name is free to start a new one under it."""
    deadline = clock.monotonic() + timeout_s
    while clock.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace())
        except ValueError:
            return
        time.sleep(0.2)
