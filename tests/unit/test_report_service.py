"""The analytics actor's core: reports one at a time on a warm Spark, retiring (Spark
stopped, then exit) after the idle time or a Spark failure."""

import os
import threading

import pytest

from rayq.analytics import service
from rayq.analytics.report import Report
from rayq.analytics.service import ReportService, follow
from rayq.analytics.sources import NewEvents
from rayq.analytics.warm import _partitions
from rayq.config import AnalyticsConfig
from rayq.core.kit.clock import FakeClock
from rayq.errors import NoEvents, RuntimeFailure


class FakeSpark:
    def __init__(self, fail=None):
        self.running, self.reports, self.held, self.stops, self.fail = False, 0, 0, 0, fail

    def report(self, gather, out_dir, window_s, progress, current, log_dir):
        if self.fail:
            raise self.fail
        self.running = True
        progress("Spark is warm")
        self.reports += 1
        self.gathered = gather(frozenset(), window_s)
        os.makedirs(os.path.join(out_dir, "tables", "summary"))
        for name, data in (("report.html", b"<html>"), ("tables/summary/part-0.parquet", b"PAR1")):
            with open(os.path.join(out_dir, name), "wb") as f:
                f.write(data)
        self.out_dir, self.window_s, self.log_dir = out_dir, window_s, log_dir
        return Report(os.path.join(out_dir, "report.html"),
                      {"summary": os.path.join(out_dir, "tables", "summary")}, events=3)

    def stop(self):
        self.running, self.stops = False, self.stops + 1


class Exiting(ReportService):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.exited = threading.Event()

    def exit(self):
        self.exited.set()


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch):
    monkeypatch.setattr(service, "RETIRE_AFTER_S", 0.0)


def make(idle_stop_s=60.0, fail=None):
    clock = FakeClock()
    svc = Exiting(AnalyticsConfig(idle_stop_s=idle_stop_s), clock, watch=False)
    svc._warm = FakeSpark(fail)
    return svc, clock


class Gathering(Exiting):
    def gather(self, where, known, window_s):
        return NewEvents(frozenset({f"{where}/part-a.parquet"}))


def test_a_report_runs_on_the_warm_spark_logs_beside_the_event_log_and_returns_its_files(
        tmp_path):
    svc = Gathering(AnalyticsConfig(), FakeClock(), watch=False)
    svc._warm = spark = FakeSpark()
    got = svc.report("/d/events", 5.0, {})
    assert spark.gathered.files == {"/d/events/part-a.parquet"}  # gather asked of where
    assert (spark.window_s, spark.log_dir) == (5.0, "/d/spark")
    assert not os.path.exists(spark.out_dir)  # made in a folder of its own, then removed
    assert got.files == {"report.html": b"<html>", "tables/summary/part-0.parquet": b"PAR1"}
    assert got.report.html == "report.html" and got.report.events == 3
    written = got.write(tmp_path / "here")  # the caller writes them where it runs
    assert written.html == str(tmp_path / "here" / "report.html")
    assert (tmp_path / "here" / "report.html").read_bytes() == b"<html>"
    assert (tmp_path / "here" / "report.html").stat().st_mode & 0o777 == 0o600  # names tenants
    assert written.tables == {"summary": str(tmp_path / "here" / "tables" / "summary")}
    assert svc.steps() == ["Spark is warm"] and svc.steps(1) == []
    assert svc.stats().reports == 1 and svc.stats().spark


@pytest.mark.parametrize("idle_s, spark_ran, retires", [
    (59.0, True, False),    # not idle long enough
    (60.0, True, True),     # idle for idle_stop_s: Spark goes
    (600.0, False, False),  # no Spark started: nothing to release
])
def test_retiring_when_idle_follows_the_idle_time(idle_s, spark_ran, retires):
    svc, clock = make()
    if spark_ran:
        svc.report("/d/events", 5.0, {})
    clock.advance(idle_s)
    assert svc.retire_if_idle() is retires
    assert (svc.exited.wait(5) if retires else svc.exited.is_set()) is retires
    assert svc._warm.stops == (1 if retires else 0)


def test_a_report_restarts_the_idle_clock():
    svc, clock = make()
    svc.report("/d/events", 5.0, {})
    clock.advance(50.0)
    svc.report("/d/events", 5.0, {})
    clock.advance(50.0)
    assert not svc.retire_if_idle() and svc.stats().idle_s == 50.0


def test_idle_stop_zero_keeps_spark_for_good():
    svc, clock = make(idle_stop_s=0.0)
    svc.report("/d/events", 5.0, {})
    clock.advance(10 ** 6)
    assert not svc.retire_if_idle()


def test_a_spark_failure_retires_the_service_and_raises():
    svc, _ = make(fail=RuntimeFailure("the Spark report failed: boom"))
    with pytest.raises(RuntimeFailure):
        svc.report("/d/events", 5.0, {})
    assert svc.exited.wait(5) and svc.stats().retiring


def test_no_events_is_the_callers_mistake_and_keeps_the_service():
    svc, _ = make(fail=NoEvents("no events"))
    with pytest.raises(NoEvents):
        svc.report("/d/events", 5.0, {})
    assert not svc.stats().retiring


def test_follow_passes_on_each_step_once_and_returns_the_answer():
    done_after, seen, heard = iter([False, False, True]), ["start", "a", "b", "c"], []
    got = follow(lambda: "ref", lambda ref: next(done_after), lambda since: seen[since:],
                 lambda ref: f"answer of {ref}", heard.append)
    assert got == "answer of ref" and heard == seen


@pytest.mark.parametrize("events, most, parts", [
    (0, 4, 1), (200_000, 4, 1), (200_001, 4, 2), (10_000_000, 4, 4), (10, 1, 1)])
def test_held_cells_are_split_in_partitions_by_count(events, most, parts):
    assert _partitions(events, most) == parts
