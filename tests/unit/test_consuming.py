"""A consumer's decisions (rayq.core.consumers.decisions) on tables of cases and a fake clock."""

import dataclasses
import random

import pytest

from rayq.config import ConsumerConfig
from rayq.core.consumers.decisions import (DeadLetter, Deferral, Finish, PlanFollower, Retry,
                                           Saturation, decide_end, effective_load,
                                           excluded_keys, held_back, is_last_try, long_poll_group,
                                           pause_after, poll_places, receive_requests, receive_size,
                                           SHORT_BATCH_MAX, short_batch,
                                           recent_task_s, refreshed_handlers, runnable,
                                           slots_to_start, Unloadable, unrunnable_outcome,
                                           may_retry)
from rayq.core.fairness.policy import Decision, ListenPlan
from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import DeferralCause, Outcome, TaskSpec, decode_outcome
from rayq.core.storage import writes
from rayq.errors import TaskError
from rayq.testing import FakeClock, memory_store
from tests.contract.helpers import batch, message, received
from tests.unit.layouts import queue_info

CONFIG = ConsumerConfig(retry_backoff_s=1.0, max_backoff_s=5.0)
SPEC = TaskSpec("report", "tasks", max_receives=5)
DLQ = 99


@pytest.mark.parametrize("ok, attempt, queue_max, expected", [
    (True, 1, 5, Finish()),
    (True, 5, 5, Finish()),               # success on the last try is a success
    (False, 1, 5, Retry(1.0)),
    (False, 2, 5, Retry(2.0)),
    (False, 3, 5, Retry(4.0)),
    (False, 4, 5, Retry(5.0)),            # doubling, capped at max_backoff_s
    (False, 5, 5, DeadLetter()),
    (False, 2, 2, DeadLetter()),          # the queue's limit comes first
    (False, 2, None, Retry(2.0)),         # a queue without a limit: the task's
    (False, 6, None, DeadLetter()),       # past the last try (a consumer died meanwhile)
])
def test_a_delivery_ends_by_its_outcome_its_attempt_and_the_limits(ok, attempt, queue_max,
                                                                    expected):
    assert decide_end(ok, attempt, SPEC, queue_max, CONFIG) == expected


def test_a_types_own_backoff_replaces_the_consumers_and_jitter_draws_in_its_upper_half():
    spec = TaskSpec("report", "tasks", max_receives=9, backoff_s=0.5, max_backoff_s=3.0)
    assert [decide_end(False, n, spec, None, CONFIG) for n in (1, 2, 3, 4, 5)] == [
        Retry(0.5), Retry(1.0), Retry(2.0), Retry(3.0), Retry(3.0)]
    assert decide_end(False, 2, spec, None, CONFIG, draw=0.0) == Retry(0.5)   # half of 1.0
    assert decide_end(False, 2, spec, None, CONFIG, draw=0.5) == Retry(0.75)
    steady = dataclasses.replace(spec, jitter=False)
    assert decide_end(False, 2, steady, None, CONFIG, draw=0.0) == Retry(1.0)


class Unreachable(ConnectionError):
    pass


@pytest.mark.parametrize("retry_on, no_retry_on, error, retried", [
    (None, (), ValueError("x"), True),                          # no rule: every error
    (None, (ValueError,), ValueError("x"), False),
    (None, (ValueError,), KeyError("x"), True),
    ((OSError,), (), Unreachable("x"), True),                   # a subclass counts
    ((OSError,), (), KeyError("x"), False),
    ((OSError,), (Unreachable,), Unreachable("x"), False),      # no_retry_on wins
    (("builtins.KeyError",), (), KeyError("x"), True),          # by name, as stored
])
def test_a_types_retry_rule_decides_which_errors_are_retried(retry_on, no_retry_on, error,
                                                             retried):
    spec = TaskSpec("report", "tasks", retry_on=retry_on, no_retry_on=no_retry_on)
    assert may_retry(spec, error) is retried


def test_a_failure_another_run_would_repeat_is_dead_lettered_on_the_first_try():
    # a value that cannot be stored: running the handler again repeats its side effects
    assert decide_end(False, 1, SPEC, 5, CONFIG, retriable=False) == DeadLetter()
    assert decide_end(True, 1, SPEC, 5, CONFIG, retriable=False) == Finish()


@pytest.mark.parametrize("attempt, task_max, queue_max, last", [
    (1, 1, None, True), (1, 2, None, False), (2, 5, 2, True), (3, 2, 5, True), (1, 5, 0, False),
])
def test_the_last_try_is_the_lower_of_the_task_and_queue_limits(attempt, task_max, queue_max, last):
    assert is_last_try(attempt, task_max, queue_max) is last


@pytest.mark.parametrize("end, write, outcome, if_lost", [
    (Finish(), writes.Finish("r", b"out"), Outcome.SUCCEEDED, Outcome.SUCCEEDED),
    (Retry(2.5), writes.ChangeVisibility("r", 2.5), Outcome.FAILED, Outcome.FAILED),
    (DeadLetter(), writes.Finish("r", b"out", DLQ), Outcome.DEAD, Outcome.FAILED),
    (Deferral(0.5), writes.Defer("r", 0.5), Outcome.DEFERRED, Outcome.DEFERRED),
])
def test_each_end_is_a_write_of_the_shard_and_has_its_outcome(end, write, outcome, if_lost):
    assert end.write("r", b"out", DLQ) == write
    assert (end.outcome, end.outcome_if_lost) == (outcome, if_lost)


def test_a_task_that_always_fails_backs_off_then_is_dead_lettered_on_a_fake_clock():
    clock = FakeClock()
    store = memory_store(clock=clock)
    [mid] = store.run(writes.Put(0, batch(dataclasses.replace(message(b"call"), task=True))))
    waits, attempt = [], 0
    while True:
        [got] = received(store, 0, 1, 30, max_receives=SPEC.max_receives, dead_letter=DLQ)
        attempt += 1
        assert got.dequeue_count == attempt
        end = decide_end(False, got.dequeue_count, SPEC, 5, CONFIG)
        store.run(end.write(got.receipt, b"boom", DLQ))
        if isinstance(end, DeadLetter):
            break
        waits.append(end.delay_s)
        clock.advance(end.delay_s - 0.01)
        assert received(store, 0, 1, 30) == []   # hidden for the whole back-off
        clock.advance(0.01)
    assert waits == [1.0, 2.0, 4.0, 5.0]
    assert store.count(0) == 0 and store.count(DLQ) == 1
    assert store.outcome(mid) == (Ending.RESULT, b"boom")


@pytest.mark.parametrize("has_handler, key, suspended, pressed, cause", [
    (False, "a", {"a"}, True, DeferralCause.CANNOT_RUN),
    (True, "a", {"a"}, True, DeferralCause.SUSPENDED),
    (True, "a", {"b"}, True, DeferralCause.HOST_PRESSURE),
    (True, "a", set(), False, None),
])
def test_a_task_is_held_back_for_the_first_reason_that_applies(has_handler, key, suspended,
                                                               pressed, cause):
    assert held_back(has_handler, key, suspended, pressed) is cause


def test_a_saturated_type_is_left_out_until_its_defer_time_passes():
    clock = FakeClock()
    saturation = Saturation(defer_s=0.5)
    saturation.saturate("report", clock.monotonic())
    assert saturation.saturated(clock.monotonic()) == {"report"}
    clock.advance(0.49)
    assert saturation.saturated(clock.monotonic()) == {"report"}
    clock.advance(0.01)
    assert saturation.saturated(clock.monotonic()) == set()


@pytest.mark.parametrize("suspended, saturated, mode, excluded", [
    ({"a"}, {"b"}, "type", {"a", "b"}),
    ({"a"}, {"b"}, "tenant", {"a"}),
    (set(), set(), "type", set()),
])
def test_a_receive_leaves_out_suspended_keys_and_saturated_types_when_keys_are_types(
        suspended, saturated, mode, excluded):
    assert excluded_keys(suspended, saturated, mode) == excluded


@pytest.mark.parametrize("recent_task_s, batch", [
    (0.019, 1), (0.01, 2), (0.005, 4), (0.001, 20), (0.0001, SHORT_BATCH_MAX), (0.0, SHORT_BATCH_MAX),
])
def test_a_poller_holds_about_twenty_milliseconds_of_short_tasks(recent_task_s, batch):
    assert short_batch(recent_task_s) == batch


@pytest.mark.parametrize("load, held, claimed, prefetch, size", [
    (4, 0, 0, 1, 16), (4, 8, 0, 1, 8), (4, 8, 8, 1, 0), (4, 17, 0, 1, 0), (4, 0, 10, 1, 6),
    (4, 9, 0, 1, 0),     # short tasks run and under half the batches' room is free: wait
    (5, 10, 0, 1, 10), (5, 11, 0, 1, 0), (1, 0, 0, 3, 4), (1, 0, 0, 6, 6),
])
def test_with_short_tasks_a_receive_asks_for_every_pollers_batch_and_half_of_them_at_once(
        load, held, claimed, prefetch, size):
    # handlers of 5 ms: a batch of 4 per poller
    assert receive_size(load, held, claimed, prefetch, recent_task_s=0.005) == size


@pytest.mark.parametrize("held, prefetch, recent_task_s, size", [
    (3, 1, None, 1),    # nothing ran yet: one at a time
    (3, 1, 0.2, 1),     # long handlers: the freed slot is received at once
    (0, 1, 0.2, 1),     # ... one at a time, however much room
    (0, 2, 0.2, 2),     # ... or prefetch at a time
    (3, 2, 0.2, 1),     # ... within the room
    (3, 1, 0.019, 0),   # short ones: wait until half the load is free
    (0, 1, 0.019, 4),   # ... then take it all
])
def test_with_long_tasks_a_receive_takes_each_slot_as_it_frees(held, prefetch, recent_task_s,
                                                                size):
    assert receive_size(4, held, 0, prefetch, recent_task_s) == size


@pytest.mark.parametrize("fixed, balanced, load", [(None, 3, 3), (7, 3, 7), (0, 3, 0)])
def test_a_pinned_load_wins_over_the_balancers(fixed, balanced, load):
    assert effective_load(fixed, balanced) == load


def test_polls_rotate_over_every_subqueue_of_every_task_queue():
    a, b = queue_info("a", {1: 0, 2: 1}), queue_info("b", {3: 0})
    routes = [(a, [2, 1]), (b, [3])]
    assert poll_places(routes, 0) == [(a, 2), (a, 1), (b, 3)]
    assert poll_places(routes, 1) == [(a, 1), (b, 3), (a, 2)]
    assert poll_places(routes, 5) == [(b, 3), (a, 2), (a, 1)]
    assert poll_places([(a, [])], 3) == []


def test_the_long_poll_waits_on_the_first_queues_subqueues_on_the_first_shard():
    a, b = queue_info("a", {1: 0, 2: 1, 4: 0}), queue_info("b", {3: 0})
    places = [(a, 4), (b, 3), (a, 2), (a, 1)]
    assert long_poll_group(places) == (a, [4, 1])


def test_handlers_are_loaded_again_only_when_their_spec_or_bytes_change():
    loads = []

    def load(blob):
        loads.append(blob)
        return f"fn<{blob.decode()}>"

    spec2 = TaskSpec("b", "tasks", concurrency=2)
    known = {"a": (SPEC, "fn-a", b"a1"), "b": (TaskSpec("b", "tasks"), "fn-b", b"b1"),
             "gone": (SPEC, "fn-gone", b"g")}
    table = {"a": (SPEC, b"a1"), "b": (spec2, b"b1"), "c": (SPEC, b"c1")}
    assert refreshed_handlers(known, table, load) == {
        "a": (SPEC, "fn-a", b"a1"), "b": (spec2, "fn<b1>", b"b1"), "c": (SPEC, "fn<c1>", b"c1")}
    assert loads == [b"b1", b"c1"]


def test_a_handler_that_cannot_be_loaded_disables_its_own_type_only():
    def load(blob):
        if blob == b"missing":
            raise ModuleNotFoundError("No module named 'jobmod'")
        return f"fn<{blob.decode()}>"

    table = {"a": (SPEC, b"missing"), "b": (SPEC, b"b1")}
    got = refreshed_handlers({}, table, load)
    assert got["a"] == (SPEC, Unloadable("ModuleNotFoundError", "No module named 'jobmod'"),
                        b"missing")
    assert got["b"] == (SPEC, "fn<b1>", b"b1")
    assert "cannot be loaded: No module named 'jobmod'" in got["a"][1].outcome_message("a")
    assert not runnable(got["a"]) and runnable(got["b"]) and not runnable(None)
    with pytest.raises(TaskError) as failed:
        decode_outcome(unrunnable_outcome("a", got["a"]))
    assert failed.value.error_type == "ModuleNotFoundError"
    assert "task type 'a' cannot be loaded: No module named 'jobmod'" in str(failed.value)
    with pytest.raises(TaskError, match="LookupError: no handler is registered"):
        decode_outcome(unrunnable_outcome("x", None))
    # kept as it is until its type is registered anew: one failure logged, not one a round
    assert refreshed_handlers(got, table, lambda blob: 1 / 0) == got
    table["a"] = (SPEC, b"a2")
    assert refreshed_handlers(got, table, load)["a"] == (SPEC, "fn<a2>", b"a2")


def decision(intervening, permits=()):
    return Decision(at=0.0, intervening=intervening, latency_victims=frozenset(),
                    usage_victims=frozenset(), offenders=frozenset(), fair_users=frozenset(),
                    zero_latency=frozenset(), starvation={"a": 0.1, "b": 0.9},
                    expected_s={}, actual_s={}, permits=dict(permits), ignored_permits={})


def plan(d, version=1, suspended=frozenset()):
    return ListenPlan(version, d, ("a", "b"), frozenset(suspended), regular_consumers=2)


@pytest.mark.parametrize("index, d, ordered", [
    (0, None, None),
    (0, decision(False), None),                      # no intervention: the shard's fair dispatch
    (0, decision(True), ["b", "a"]),                 # most starved first
    (2, decision(False, {"a": 2}), ["a", "b"]),      # a booster serves permits first
    (1, decision(False, {"a": 2}), None),            # a regular consumer does not
])
def test_a_consumer_follows_the_plan_only_while_it_intervenes_or_as_a_booster(index, d, ordered):
    follower = PlanFollower(index, random.Random(0))
    follower.adopt(plan(d))
    assert follower.order(exclude=set()) == ordered


def test_a_follower_keeps_its_plan_until_a_newer_one_and_counts_usage_since():
    follower = PlanFollower(0, random.Random(0))
    assert (follower.version, follower.suspended) == (None, frozenset())
    follower.spend("a", 1.0)
    assert follower.spent == {}                      # nothing to follow yet
    follower.adopt(plan(decision(True), version=3, suspended={"x"}))
    follower.spend("a", 1.5)
    assert follower.spent == {"a": 3.0}              # scaled to the two regular consumers
    follower.adopt(None)                             # nothing newer
    assert (follower.version, follower.spent) == (3, {"a": 3.0})
    follower.adopt(plan(decision(True), version=4))
    assert (follower.version, follower.spent, follower.suspended) == (4, {}, frozenset())


@pytest.mark.parametrize("load, running, start", [
    (3, set(), [0, 1, 2]), (3, {0, 2}, [1]), (2, {0, 1, 2}, []), (0, set(), []),
])
def test_pollers_start_in_the_free_slots_below_the_load(load, running, start):
    assert slots_to_start(load, running) == start


@pytest.mark.parametrize("cause, pause", [
    (DeferralCause.HOST_PRESSURE, 0.5), (DeferralCause.CONCURRENCY, 0.0),
    (DeferralCause.SUSPENDED, 0.0), (DeferralCause.CANNOT_RUN, 0.0),
])
def test_a_poller_rests_after_a_deferral_only_when_its_host_is_pressed(cause, pause):
    assert pause_after(cause, 0.5) == pause


def test_the_ends_a_consumer_decides_reach_the_shard_as_the_same_writes():
    ends = [Finish().write("r", b"x", None), Retry(1.0).write("s", b"", None),
            DeadLetter().write("t", b"err", DLQ), Deferral(0.5).write("u", b"", None)]
    frames = [[name, list(fields)] for name, fields in map(writes.compact, ends)]  # msgpack's
    assert writes.decode_ends(frames) == ends


@pytest.mark.parametrize("order, exclude, wait_s, requests", [
    (["b", "a"], {"x"}, 0.0, [dict(keys=["b", "a"]), dict(wait_s=0.0, exclude=["x"])]),
    (None, {"y", "x"}, 0.0, [dict(wait_s=0.0, exclude=["x", "y"])]),
    ([], set(), 2.0, [dict(wait_s=2.0, exclude=None)]),
])
def test_a_receive_tries_the_plans_order_first_then_any_key_but_the_excluded(order, exclude,
                                                                             wait_s, requests):
    assert receive_requests(order, exclude, wait_s) == requests


def test_the_recent_task_time_starts_at_the_first_and_moves_a_fifth_of_the_way():
    assert recent_task_s(None, 0.5) == 0.5
    assert recent_task_s(0.5, 1.5) == pytest.approx(0.7)


@pytest.mark.parametrize("cause, age_s, gives", [
    (DeferralCause.CANNOT_RUN, 601.0, True),    # no handler for ten minutes: dead-lettered
    (DeferralCause.CANNOT_RUN, 599.0, False),   # a handler may still be registered
    (DeferralCause.CONCURRENCY, 10_000.0, False),
    (DeferralCause.SUSPENDED, 10_000.0, False),
    (DeferralCause.HOST_PRESSURE, 10_000.0, False),
])
def test_only_a_task_nobody_can_run_is_given_up_and_only_after_its_grace(cause, age_s, gives):
    from rayq.core.consumers.decisions import gives_up
    assert gives_up(cause, 1000.0, 1000.0 + age_s, 600.0) is gives
