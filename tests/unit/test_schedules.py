"""Schedules: the next-tick arithmetic of every_s and cron, the tick ids, the checks, and
the book's firing rules (one firing per tick, catch-up once, nothing lost or repeated
over a restart) on a fake clock."""

import math

import pytest

from rayq.core.codec.tasks import decode_call, decode_call_options, encode_call
from rayq.core.control.schedules import (MAX_CALL_BYTES, RETRY_S, Cadence, Planned,
                                         ScheduleBook, check_schedule_name, tenant_of, tick_id)
from rayq.core.kit.clock import FakeClock
from rayq.core.kit.kv import LmdbKV
from rayq.errors import AuthError, InvalidMessage
from rayq.testing import MemoryKV

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
CALL = encode_call("report", (1, "a"), {"full": True}, 1 << 20)
TICK_S = 0.25  # how often the manager looks for due schedules


@pytest.mark.parametrize("every_s, t, expected", [
    (1, 100.0, 101.0),          # a tick at t itself is past: the next one
    (1, 100.5, 101.0),
    (1, 100.999, 101.0),
    (0.25, 100.1, 100.25),
    (0.1, 0.3, 0.4),            # counted in milliseconds: no float drift
    (0.001, 5.0, 5.001),
    (7, 20.0, 21.0),            # multiples of every_s since the epoch
    (3600, T0, 1_700_002_800.0),  # on the hour, UTC
    (86400, T0, 1_700_006_400.0),  # at midnight, UTC
])
def test_an_every_s_schedule_ticks_on_the_multiples_of_every_s_since_the_epoch(every_s, t,
                                                                                expected):
    assert Cadence(every_s=every_s).next_after(t) == expected


@pytest.mark.parametrize("cron, t, expected", [
    ("* * * * *", T0, 1_700_000_040.0),        # the next whole minute
    ("*/5 * * * *", T0, 1_700_000_100.0),      # 22:15
    ("0 0 * * *", T0, 1_700_006_400.0),        # midnight UTC, not local time
    ("0 0 * * *", 1_700_006_400.0, 1_700_092_800.0),  # at a tick: the following one
    ("30 9 * * 1", T0, 1_700_472_600.0),       # Monday 2023-11-20 09:30 UTC
    ("0 12 1 1 *", T0, 1_704_110_400.0),       # 2024-01-01 12:00 UTC
])
def test_a_cron_schedule_ticks_at_the_times_its_fields_name_in_utc(cron, t, expected):
    assert Cadence(cron=cron).next_after(t) == expected


@pytest.mark.parametrize("name, tick, expected", [
    ("nightly", 1_700_006_400.0, "nightly@2023-11-15T00:00:00Z"),
    ("fast", T0 + 0.25, "fast@2023-11-14T22:13:20.250Z"),
    ("a b/c", 0.0, "a b/c@1970-01-01T00:00:00Z"),
])
def test_a_tick_goes_by_its_schedule_name_and_utc_time(name, tick, expected):
    assert tick_id(name, tick) == expected


@pytest.mark.parametrize("every_s, cron", [
    (None, None), (1, "* * * * *"), (0, None), (-1, None), (0.0001, None),
    (math.nan, None), (math.inf, None), (True, None), ("1", None), (367 * 86400, None),
    (None, ""), (None, "* * * *"), (None, "0 0 * * * *"), (None, "61 * * * *"),
    (None, "@hourly"), (None, "0 0 30 2 *"), (None, "H * * * *"), (None, 5),
    (None, "a b c d e"),
])
def test_a_cadence_takes_exactly_one_of_every_s_and_a_five_field_cron(every_s, cron):
    with pytest.raises(InvalidMessage):
        Cadence(every_s, cron)


@pytest.mark.parametrize("name", ["", None, 5, "a\nb", "x" * 129, "\U0001F600" * 51])
def test_a_schedule_name_is_a_checked_name_that_fits_a_record_key(name):
    with pytest.raises(InvalidMessage):
        check_schedule_name(name)


def test_a_schedule_name_may_be_any_printable_name_that_fits():
    for name in ("nightly", "a b/c@d", "é" * 100, "x" * 128):
        assert check_schedule_name(name) == name


def test_an_account_schedules_as_its_own_tenant_and_the_admin_as_any():
    assert tenant_of("acme", None) == "acme"
    assert tenant_of("acme", "acme") == "acme"
    assert tenant_of("default", None) == "default"
    assert tenant_of("default", "globex") == "globex"
    with pytest.raises(AuthError):
        tenant_of("acme", "globex")
    with pytest.raises(InvalidMessage):
        tenant_of("default", "")


@pytest.mark.parametrize("call", [b"", b"\xc1", encode_call("t", (), {}, 1 << 20)[:-1],
                                  "text", encode_call("t", ("x" * MAX_CALL_BYTES,), {}, 1 << 20)])
def test_a_schedule_keeps_only_a_task_call_of_bounded_size(call):
    with pytest.raises(InvalidMessage):
        Planned.made("acme", "s", "t", None, Cadence(every_s=1), call, T0)


def test_a_schedule_shows_its_arguments_as_stored_and_its_last_task_id():
    planned = Planned.made("acme", "s", "report", None, Cadence(every_s=60), CALL, T0)
    view = planned.view()
    assert (view.name, view.type, view.tenant, view.every_s, view.cron) == \
        ("s", "report", "acme", 60.0, None)
    assert (view.args, view.kwargs) == ((1, "a"), {"full": True})
    assert (view.next_at, view.last_fired_at, view.last_task_id) == (T0 + 40, None, None)
    fired = planned.fired(T0 + 40).view()
    assert (fired.last_fired_at, fired.last_task_id) == (T0 + 40, tick_id("s", T0 + 40))
    assert fired.next_at == T0 + 100


def test_a_fired_task_is_put_as_a_task_of_its_tenant_keyed_as_a_submit_is():
    planned = Planned.made("default", "s", "report", "globex", Cadence(every_s=1), CALL, T0)
    attrs, body, task_id = planned.entry("tenant_type")
    assert (attrs.tenant, attrs.type, attrs.key, attrs.task) == \
        ("globex", "report", "globex/report", True)
    assert task_id == tick_id("s", T0 + 1)
    # the call as scheduled, its handler told the tick's id (rayq.current_task().id)
    assert decode_call_options(body) == (*decode_call(CALL), {"id": task_id})


# -- the book: what the manager's ticker does with it -----------------------------------
def tick(book: ScheduleBook, clock: FakeClock, submitted: list[str]) -> None:
    """One round of the manager's ticker, submitting by appending the task ids."""
    due = book.due(clock.now())
    if due:
        book.firing(due)
        submitted += [p.task_id for p in due]
        book.fired(due, clock.now())


def run_for(seconds: float, book: ScheduleBook, clock: FakeClock, submitted: list[str]) -> None:
    for _ in range(round(seconds / TICK_S)):
        clock.advance(TICK_S)
        tick(book, clock, submitted)


def scheduled(book: ScheduleBook, clock: FakeClock, name: str = "s", **cadence) -> Planned:
    return book.put(Planned.made("acme", name, "report", None, Cadence(**cadence), CALL,
                                 clock.now()))


def test_an_every_second_schedule_fires_each_tick_once_under_the_ticks_id():
    clock, book, submitted = FakeClock(T0), ScheduleBook(MemoryKV()), []
    scheduled(book, clock, every_s=1)
    run_for(10, book, clock, submitted)
    assert submitted == [tick_id("s", T0 + k) for k in range(1, 11)]


def test_ticks_missed_while_down_fire_once_on_return_then_the_next_tick_follows_now():
    clock, book, submitted = FakeClock(T0), ScheduleBook(MemoryKV()), []
    scheduled(book, clock, every_s=1)
    run_for(3, book, clock, submitted)
    clock.advance(30.1)  # down: 30 ticks missed
    tick(book, clock, submitted)
    assert submitted == [tick_id("s", T0 + k) for k in (1, 2, 3, 4)]  # 4: the first missed
    [planned] = book.of("acme")
    assert (planned.last_fired_at, planned.next_at) == (T0 + 4, T0 + 34)
    run_for(2, book, clock, submitted)
    assert submitted[4:] == [tick_id("s", T0 + 34), tick_id("s", T0 + 35)]


def test_a_cron_schedule_missed_for_hours_fires_once_then_on_its_next_time():
    clock, book, submitted = FakeClock(T0), ScheduleBook(MemoryKV()), []
    scheduled(book, clock, cron="*/5 * * * *")
    clock.advance(5 * 3600)
    tick(book, clock, submitted)
    tick(book, clock, submitted)
    assert submitted == [tick_id("s", 1_700_000_100.0)]
    [planned] = book.of("acme")
    assert planned.next_at == Cadence(cron="*/5 * * * *").next_after(clock.now())


def test_schedules_and_their_last_firing_outlive_a_restart(tmp_path):
    clock, submitted = FakeClock(T0), []
    kv = LmdbKV(str(tmp_path / "manager"))
    book = ScheduleBook(kv)
    scheduled(book, clock, every_s=1)
    scheduled(book, clock, "nightly", cron="0 0 * * *")
    run_for(2, book, clock, submitted)
    kv.close()
    book = ScheduleBook(LmdbKV(str(tmp_path / "manager")))
    assert [p.name for p in book.of("acme")] == ["nightly", "s"]
    run_for(2, book, clock, submitted)
    assert submitted == [tick_id("s", T0 + k) for k in (1, 2, 3, 4)]  # none lost, none twice


def test_a_manager_that_stops_between_submit_and_record_submits_the_same_id_again():
    clock, kv, submitted = FakeClock(T0), MemoryKV(), []
    book = ScheduleBook(kv)
    scheduled(book, clock, every_s=1)
    clock.advance(1)
    due = book.due(clock.now())
    book.firing(due)
    submitted += [p.task_id for p in due]  # submitted; the manager stops before fired()
    clock.advance(5)
    tick(ScheduleBook(kv), clock, submitted)  # its successor
    assert submitted == [tick_id("s", T0 + 1)] * 2  # the put stores it once: the same id


def test_a_schedule_replaced_or_removed_while_it_fires_keeps_its_new_state():
    clock, book = FakeClock(T0), ScheduleBook(MemoryKV())
    scheduled(book, clock, "replaced", every_s=1)
    scheduled(book, clock, "removed", every_s=1)
    clock.advance(1)
    due = book.due(clock.now())
    book.firing(due)
    new = scheduled(book, clock, "replaced", every_s=60)  # while the puts are under way
    assert book.remove("acme", "removed")
    assert book.fired(due, clock.now()) == []
    assert book.of("acme") == [new]


def test_a_schedule_whose_firing_failed_waits_before_it_fires_again():
    clock, book = FakeClock(T0), ScheduleBook(MemoryKV())
    scheduled(book, clock, every_s=1)
    clock.advance(1)
    failed = book.due(clock.now())
    book.hold(failed, clock.now() + RETRY_S)
    assert book.due(clock.now() + RETRY_S / 2) == []
    assert book.due(clock.now() + RETRY_S) == failed


def test_schedules_are_per_account_and_scheduling_again_replaces():
    clock, book = FakeClock(T0), ScheduleBook(MemoryKV())
    scheduled(book, clock, every_s=1)
    book.put(Planned.made("globex", "s", "report", None, Cadence(every_s=5), CALL, T0))
    replaced = scheduled(book, clock, cron="* * * * *")
    assert book.of("acme") == [replaced]
    assert [p.cadence.every_s for p in book.of("globex")] == [5.0]
    assert not book.remove("acme", "other")
    assert book.remove("acme", "s") and book.of("acme") == []
    assert len(book.of("globex")) == 1


def test_no_schedule_is_due_before_its_first_tick():
    clock, book = FakeClock(T0 + 0.5), ScheduleBook(MemoryKV())
    scheduled(book, clock, every_s=1)
    assert book.due(T0 + 0.999) == []
    assert len(book.due(T0 + 1)) == 1
