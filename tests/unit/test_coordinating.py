"""The fairness coordinator's decisions around evaluate() (rayq.core.fairness.coordinating), and
the retry schedule of calls between actors (rayq.core.kit.retry), on a fake clock."""

import random

import pytest

from rayq.core.fairness.coordinating import (booster_consumers, fairness_report, intervening_since,
                                             pending_keys)
from rayq.core.fairness.policy import Decision, KeyState, key_latency
from rayq.core.kit.retry import RetrySchedule, backoff_s
from rayq.core.codec.model import KeyDepth
from rayq.testing import FakeClock


def decision(intervening, at=0.0, **fields):
    base = dict(latency_victims=frozenset(), usage_victims=frozenset(), offenders=frozenset(),
                fair_users=frozenset(), zero_latency=(), expected_s={}, actual_s={},
                starvation={}, permits={}, ignored_permits={})
    return Decision(at=at, intervening=intervening, **{**base, **fields})


def test_pending_keys_take_the_longest_wait_and_oldest_enqueue_over_the_task_subqueues():
    depths = [KeyDepth(1, "a", 3, 10.0, 100.0), KeyDepth(2, "a", 1, 40.0, 150.0),
              KeyDepth(1, "b", 0, 99.0, 50.0),      # empty: not pending
              KeyDepth(1, "c", 2, 0.0, None),       # nothing visible yet
              KeyDepth(9, "d", 5, 50.0, 10.0)]      # not a task subqueue
    assert pending_keys(depths, {1, 2}, {"a": 2}) == {"a": KeyState("a", 40.0, 100.0, 2)}


def test_a_delayed_message_waits_from_when_it_could_first_be_received():
    sent_at, shown_at, now = 0.0, 1500.0, 1501.0
    depths = [KeyDepth(1, "late", 1, now - shown_at, sent_at, now - sent_at, shown_at)]
    state = pending_keys(depths, {1}, {})["late"]
    assert key_latency(state, now, "enqueue") == pytest.approx(1.0)  # not 1 501 s


@pytest.mark.parametrize("before, after, since, expected", [
    (None, False, None, None),
    (None, True, None, 500.0),          # starts now
    (False, True, None, 500.0),
    (True, True, 200.0, 200.0),         # goes on: since it began
    (True, False, 200.0, None),         # stopped
])
def test_an_intervention_is_dated_from_the_evaluation_that_started_it(before, after, since,
                                                                      expected):
    previous = None if before is None else decision(before)
    assert intervening_since(previous, decision(after), since, now=500.0) == expected


@pytest.mark.parametrize("permits, max_load, max_boost, extra", [
    ({}, 8, 4, 0), ({"a": 1}, 8, 4, 1), ({"a": 8}, 8, 4, 1), ({"a": 8, "b": 1}, 8, 4, 2),
    ({"a": 4, "b": 4, "c": 4}, 2, 4, 4),   # bounded
])
def test_booster_consumers_are_one_per_max_load_permits_bounded(permits, max_load, max_boost,
                                                                extra):
    assert booster_consumers(permits, max_load, max_boost) == extra


def test_a_report_without_a_decision_is_empty_and_one_with_copies_it():
    empty = fairness_report(None, ["a"], random.Random(0), (), None, rules=(), history=(),
                            noisy=())
    assert (empty.evaluated_at, empty.intervening, empty.victims, empty.permits) == (
        None, False, frozenset(), {})
    assert empty.listen_order == ("a",)
    d = decision(True, at=7.0, latency_victims=frozenset({"a"}), usage_victims=frozenset({"a"}),
                 starvation={"a": 0.5, "b": 0.1}, permits={"a": 2})
    full = fairness_report(d, ["a", "b", "s"], random.Random(0), {"s"}, 3.0, rules=("r",),
                           history=({"h": 1},), noisy=("n",))
    assert (full.evaluated_at, full.intervening, full.intervening_since) == (7.0, True, 3.0)
    assert full.victims == frozenset({"a"}) and full.permits == {"a": 2}
    assert full.listen_order == ("a", "b")      # most starved first, suspended left out
    assert (full.suspended, full.history, full.noisy) == (("r",), ({"h": 1},), ("n",))


@pytest.mark.parametrize("attempt, wait", [(1, 0.05), (2, 0.1), (3, 0.2), (5, 0.8), (6, 1.0),
                                           (40, 1.0), (0, 0.05)])
def test_a_call_is_issued_again_after_doubling_waits_up_to_a_ceiling(attempt, wait):
    assert RetrySchedule().wait_s(attempt) == pytest.approx(wait)


def test_retries_give_up_once_their_time_is_spent_on_a_fake_clock():
    clock, schedule = FakeClock(), RetrySchedule(give_up_after_s=3.0)
    started, waited, attempt = clock.monotonic(), [], 0
    while not schedule.gives_up(started, clock.monotonic()):
        attempt += 1
        waited.append(schedule.wait_s(attempt))
        clock.advance(waited[-1])
    assert sum(waited) >= 3.0 > sum(waited[:-1])
    assert RetrySchedule(give_up_after_s=0.0).gives_up(started, started)   # no retry at all


@pytest.mark.parametrize("attempt, first, cap, wait", [(1, 1.0, 60, 1.0), (4, 1.0, 60, 8.0),
                                                       (10, 1.0, 60, 60.0), (3, 0.5, 1.5, 1.5)])
def test_back_off_doubles_from_the_first_wait(attempt, first, cap, wait):
    assert backoff_s(attempt, first, cap) == wait
