"""Schedules on a running runtime: ticks fire once each, as the scheduling account, are
listed and stopped, outlive a restart on the same data_dir (missed ticks fire once), and
bad input is refused when scheduled."""

import time

import pytest
import ray
from click.testing import CliRunner

import rayq
import rayq.cli
from rayq.cli import main
from rayq.config import Config, ConsumerConfig
from rayq.core.control.schedules import tick_id
from tests.integration.conftest import start_runtime, wait_until
from tests.integration.probe import enter, leave, probe

CONFIG = Config(consumers=ConsumerConfig(count=1, visibility_timeout_s=5.0, poll_wait_s=0.5,
                                         retry_backoff_s=0.1, adjust_interval_s=0.2))
PROBE = "schedules"
WAIT_S = 120.0


@rayq.task(type="sched_tick")
def ticked(label, step=1):
    enter("sched_tick", label, name=PROBE)
    leave("sched_tick", name=PROBE)
    return step


@pytest.fixture(scope="module")
def runtime(ray_session, tmp_path_factory):
    client, data_dir = start_runtime(tmp_path_factory, CONFIG, name="schedules")
    probe(PROBE)
    yield client, data_dir
    rayq.shutdown()


@pytest.fixture
def client(runtime):
    return runtime[0]


def runs(label: str) -> int:
    """How many times handlers ran with ``label``."""
    return ray.get(probe(PROBE).report.remote())["attempts"].get(label, 0)


def tasks_of(client, name: str, first: float, last: float) -> dict[float, rayq.TaskInfo]:
    """The tasks schedule ``name`` (every second) submitted for its ticks from ``first``
    to ``last``, by tick."""
    found = {}
    for tick in range(int(first), int(last) + 1):
        try:
            found[float(tick)] = client.task(tick_id(name, tick))
        except rayq.TaskNotFound:
            pass
    return found


def all_ended(client, name: str, first: float, last: float) -> dict[float, rayq.TaskInfo]:
    """:func:`tasks_of`, once every one of them ended."""
    def ended():
        found = tasks_of(client, name, first, last)
        return found if all(info.done for info in found.values()) else None
    return wait_until(ended, WAIT_S, 0.5, f"the tasks of {name} to end")


def test_bad_schedules_are_refused_when_made(client):
    for every_s, cron in [(None, None), (1, "* * * * *"), (0, None), (-1, None),
                          (None, "61 * * * *"), (None, "* * *"), (None, "0 0 30 2 *")]:
        with pytest.raises(rayq.InvalidMessage):
            client.schedule("bad", ticked, "bad", every_s=every_s, cron=cron)
    for name in ("", "a\nb", "x" * 129, None):
        with pytest.raises(rayq.InvalidMessage):
            client.schedule(name, ticked, "bad", every_s=1)
    with pytest.raises(rayq.InvalidMessage):
        client.schedule("bad", ticked, object(), every_s=1)  # not msgpack-able
    with pytest.raises(rayq.InvalidMessage):
        client.schedule("bad", lambda: None, every_s=1)  # not a @rayq.task
    assert [s.name for s in client.schedules()] == []


def test_schedules_lists_each_schedule_with_its_next_tick_and_scheduling_again_replaces(
        client, monkeypatch):
    made = client.schedule("listed", ticked, "listed", every_s=3600, tenant="globex", step=2)
    assert isinstance(made, rayq.Schedule)
    assert made.next_at > time.time() and made.last_fired_at is None
    [listed] = client.schedules()
    assert listed == made
    assert (listed.type, listed.tenant, listed.every_s, listed.cron) == \
        ("sched_tick", "globex", 3600.0, None)
    assert (listed.args, listed.kwargs) == (("listed",), {"step": 2})
    replaced = client.schedule("listed", ticked, "again", cron="0 0 1 1 *")
    assert client.schedules() == [replaced]
    assert (replaced.every_s, replaced.cron, replaced.tenant) == (None, "0 0 1 1 *", "default")
    monkeypatch.setattr(rayq.cli.console, "width", 160)  # one line per row
    shown = CliRunner().invoke(main, ["schedules"])
    assert shown.exit_code == 0, shown.output
    assert "listed" in shown.output and "sched_tick as default" in shown.output
    assert "cron 0 0 1 1 *" in shown.output
    assert client.unschedule("listed") and client.schedules() == []


def test_an_accounts_schedule_is_its_own_and_fires_as_that_account(client):
    client.register(ticked)  # handlers are the admin's to register
    acme = rayq.connect(account="sched-acme", key=client.create_account("sched-acme"))
    with pytest.raises(rayq.AuthError):
        acme.schedule("beat", ticked, "acme", every_s=1, tenant="globex")
    acme.schedule("beat", ticked, "acme", every_s=1)
    assert client.schedules() == []  # the admin's own are none
    fired = wait_until(lambda: acme.schedules()[0].last_task_id, WAIT_S, 0.2,
                       "the account's schedule to fire")
    assert acme.result(fired, timeout_s=WAIT_S) == 1
    assert acme.task(fired).tenant == "sched-acme"
    with pytest.raises(rayq.TaskNotFound):
        client.task(fired)  # the account's task, not the admin's
    assert acme.unschedule("beat") and not acme.unschedule("beat")


def test_unschedule_stops_the_ticks(client):
    client.schedule("stop", ticked, "stop", every_s=1)
    wait_until(lambda: runs("stop") >= 2, WAIT_S, 0.2, "two ticks")
    assert client.unschedule("stop")
    stopped_at = time.time()
    assert client.schedules() == []
    time.sleep(4)  # ticks that would have fired
    assert tasks_of(client, "stop", stopped_at + 1, time.time() + 1) == {}
    assert not client.unschedule("stop")


def test_an_every_second_schedule_fires_each_tick_once_across_a_restart(runtime):
    client, data_dir = runtime
    started = client.schedule("beat", ticked, "beat", every_s=1).next_at
    wait_until(lambda: runs("beat") >= 3, WAIT_S, 0.2, "three ticks")
    rayq.shutdown()
    down_at = time.time()
    time.sleep(4)  # ticks pass with no runtime
    back_at = time.time()
    client = rayq.start(data_dir=data_dir, config=CONFIG)
    assert [s.name for s in client.schedules()] == ["beat"]
    wait_until(lambda: len(tasks_of(client, "beat", back_at, time.time() + 1)) >= 3, WAIT_S,
               1.0, "three ticks after the restart")
    assert client.unschedule("beat")
    found = all_ended(client, "beat", started, time.time() + 1)

    # every tick ran once at most: one task per tick id, each delivered once, and the
    # handler ran as many times as there are tasks
    assert runs("beat") == len(found)
    assert all(info.attempts == 1 and info.state == "succeeded" for info in found.values())
    # the ticks missed while down fired once on return, not once each
    assert [t for t in found if down_at + 1 < t < back_at] == []
    assert len([t for t, info in found.items() if t < back_at <= info.submitted_at]) <= 1
    assert len([t for t in found if t < down_at]) >= 3
    assert len([t for t in found if t > back_at]) >= 3
