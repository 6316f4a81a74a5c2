"""Every reason a consumer puts a task back unrun is a deferral of its key, with its
cause, in task_stats and in the event log (docs/fairness-coordinator.md: concurrency
limits, resource filters such as a pressed host, suspension rules, messages that
cannot run)."""

import pytest

from rayq.analytics.eventlog import EventLog, log_report, read_events
from rayq.config import ConsumerConfig
from rayq.core.consumers.balancer import HostReading, host_pressed
from rayq.core.fairness.policy import UsageWindows
from rayq.core.codec.tasks import DeferralCause, Outcome, UsageReport
from rayq.core.fairness.tallies import Tally


def deferral(cause, tenant="acme", type_="pdf"):
    return UsageReport(type_, tenant, type_, 0.0, Outcome.DEFERRED, 1.0, 100.0, "m1", 1, "tasks",
                       cause)


def test_task_stats_count_deferrals_per_cause():
    tally = Tally()
    for cause in (DeferralCause.CONCURRENCY, DeferralCause.HOST_PRESSURE,
                  DeferralCause.HOST_PRESSURE, DeferralCause.SUSPENDED, DeferralCause.CANNOT_RUN):
        tally.add(deferral(cause))
    tally.add(deferral(DeferralCause.SUSPENDED, tenant="beta"))
    [acme, beta] = tally.rows()
    assert acme.deferred == 5 and acme.deferred_by_cause == {
        "concurrency": 1, "host_pressure": 2, "suspended": 1, "cannot_run": 1}
    [by_type] = tally.rows(by="type")
    assert by_type.deferred == 6 and by_type.deferred_by_cause["suspended"] == 2


def test_every_cause_counts_against_the_keys_expected_usage():
    windows = UsageWindows(window_s=300, windows=6)
    for cause in DeferralCause:
        r = deferral(cause)
        windows.add(r.key, r.usage_s, r.outcome is Outcome.DEFERRED, r.finished_at)
    assert windows.table(now=100.0).deferred["pdf"][-1] == len(DeferralCause)


def test_the_event_log_keeps_the_cause(tmp_path):
    log = EventLog(tmp_path, "test")
    log_report(log, deferral(DeferralCause.HOST_PRESSURE))
    log.flush()
    rows = read_events(tmp_path).to_pylist()
    assert [(r["kind"], r["detail"], r["key"]) for r in rows] == [
        ("deferral", "host_pressure", "pdf")]


@pytest.mark.parametrize("memory, cpu, pressed", [
    (50.0, 50.0, False), (95.0, 100.0, False), (95.1, 10.0, True), (10.0, 100.0, False)])
def test_a_host_over_its_memory_or_cpu_limit_is_pressed(memory, cpu, pressed):
    assert host_pressed(HostReading(memory, cpu), ConsumerConfig()) is pressed
    tight = ConsumerConfig(max_host_cpu_percent=80.0)
    assert host_pressed(HostReading(10.0, 81.0), tight)
