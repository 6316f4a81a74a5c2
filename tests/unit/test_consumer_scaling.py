"""Consumer actors follow the task backlog (docs/autoscaling.md#consumers-follow-the-backlog):
the rule as tables of cases, the configuration's bounds, and a simulated day."""

import pytest

from rayq.config import ConfigError, ConsumerConfig
from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueInfo, SubqueueInfo
from rayq.core.control.scaling import (ConsumerRule, ConsumerScale, chosen_scale,
                                       consumers_for, next_scale, restored_scale,
                                       task_backlog, wanted_consumers)
from rayq.core.kit.clock import FakeClock

# 0 to 4 consumers of 8 tasks each; down after 60 s of an empty backlog
RULE = ConsumerRule(min_count=0, max_count=4, max_load=8, idle_s=60.0)
FLOOR = ConsumerRule(min_count=1, max_count=4, max_load=8, idle_s=60.0)
FIXED = ConsumerRule(min_count=2, max_count=2, max_load=8, idle_s=60.0, autoscaled=False)


@pytest.mark.parametrize("backlog, rule, need", [
    (0, RULE, 0),
    (1, RULE, 1),             # scale from zero: one task is enough
    (8, RULE, 1),
    (9, RULE, 2),             # rounded up
    (1_000_000, RULE, 4),     # capped at max_count
    (0, FLOOR, 1),            # never below min_count
])
def test_the_backlog_needs_one_consumer_per_max_load_tasks_within_the_bounds(backlog, rule, need):
    assert consumers_for(backlog, rule) == need


@pytest.mark.parametrize("backlog, current, busy_at, now, rule, wanted", [
    # up at once, whatever the last busy time
    (1, 0, 0.0, 0.0, RULE, 1),
    (20, 1, 100.0, 100.0, RULE, 3),
    (1_000_000, 2, 0.0, 5.0, RULE, 4),
    # enough already: a shorter backlog lowers nothing while tasks wait or run
    (3, 4, 0.0, 1_000.0, RULE, 4),
    (1, 3, 0.0, 1_000.0, FLOOR, 3),
    # empty, but not for idle_s yet
    (0, 3, 100.0, 159.0, RULE, 3),
    # empty for idle_s: down to min_count in one step
    (0, 3, 100.0, 160.0, RULE, 0),
    (0, 3, 100.0, 500.0, FLOOR, 1),
    # outside the bounds (a count pinned before, a configuration changed): inside at once
    (0, 9, 100.0, 100.0, RULE, 4),
    (0, 0, 100.0, 100.0, FLOOR, 1),
])
def test_consumers_go_up_at_once_and_down_only_after_the_backlog_idled(
        backlog, current, busy_at, now, rule, wanted):
    assert wanted_consumers(backlog, current, busy_at=busy_at, now=now, rule=rule) == wanted


@pytest.mark.parametrize("scale, backlog, now, after", [
    # the rule moves an unpinned count and notes when the backlog was busy
    (ConsumerScale(0, 0.0), 5, 10.0, ConsumerScale(1, 10.0)),
    (ConsumerScale(2, 10.0), 0, 30.0, ConsumerScale(2, 10.0)),
    (ConsumerScale(2, 10.0), 0, 70.0, ConsumerScale(0, 10.0)),
    # a pinned count stays, busy time noted all the same
    (ConsumerScale(0, 0.0, pinned=True), 50, 10.0, ConsumerScale(0, 10.0, pinned=True)),
    (ConsumerScale(3, 0.0, pinned=True), 0, 999.0, ConsumerScale(3, 0.0, pinned=True)),
])
def test_a_round_follows_the_backlog_unless_the_count_is_pinned(scale, backlog, now, after):
    assert next_scale(scale, backlog, now, RULE) == after


@pytest.mark.parametrize("backlog, now", [(0, 1_000.0), (1_000_000, 5.0)])
def test_a_fixed_count_never_moves(backlog, now):
    assert next_scale(ConsumerScale(2, 0.0), backlog, now, FIXED).wanted == 2


@pytest.mark.parametrize("scale, count, after", [
    (ConsumerScale(3, 7.0), 5, ConsumerScale(5, 7.0, pinned=True)),
    (ConsumerScale(3, 7.0), 0, ConsumerScale(0, 7.0, pinned=True)),   # stop them all, and stay
    (ConsumerScale(5, 7.0, pinned=True), None, ConsumerScale(5, 7.0)),  # back to the rule
    (ConsumerScale(5, 7.0), None, ConsumerScale(5, 7.0)),
])
def test_scale_consumers_pins_a_count_and_none_hands_it_back(scale, count, after):
    assert chosen_scale(scale, count) == after


@pytest.mark.parametrize("wanted, pinned, rule, after", [
    (None, False, RULE, ConsumerScale(0, 50.0)),     # a fresh runtime: the fewest
    (None, False, FIXED, ConsumerScale(2, 50.0)),    # fixed: count (both bounds)
    (3, False, RULE, ConsumerScale(3, 50.0)),        # a manager that took over
    (7, True, FIXED, ConsumerScale(7, 50.0, pinned=True)),
])
def test_a_manager_starts_from_the_persisted_count_busy_now(wanted, pinned, rule, after):
    assert restored_scale(wanted, pinned, rule=rule, now=50.0) == after


def test_a_manager_that_took_over_waits_the_idle_delay_before_lowering():
    clock = FakeClock()
    scale = restored_scale(3, False, rule=RULE, now=clock.monotonic())
    clock.advance(59.0)
    assert next_scale(scale, 0, clock.monotonic(), RULE).wanted == 3
    clock.advance(1.0)
    assert next_scale(scale, 0, clock.monotonic(), RULE).wanted == 0


def test_a_burst_scales_up_at_once_and_back_to_zero_after_the_idle_delay():
    clock = FakeClock()
    scale = restored_scale(None, False, rule=RULE, now=clock.monotonic())
    seen = []
    # backlog per one-second round: quiet, a burst that drains, quiet for 61 s
    for backlog in [0, 0, 12, 40, 25, 9, 1] + [0] * 61:
        clock.advance(1.0)
        scale = next_scale(scale, backlog, clock.monotonic(), RULE)
        seen.append(scale.wanted)
    assert seen[:7] == [0, 0, 2, 4, 4, 4, 4]
    # last seen busy at 7 s: down at 67 s, 60 s later
    assert seen[7:66] == [4] * 59 and seen[66:] == [0, 0]


def queue(name, *subqueues):
    return QueueInfo(name, tuple(SubqueueInfo(sq, sq % 2, SubqueueState.ALL, 1) for sq in subqueues),
                     min_subqueues=1, max_receives=5, dead_letter=(), created_at=0.0)


def test_the_backlog_is_every_task_queue_subqueue_count():
    counts = {1: 5, 2: 7, 3: 100, 4: 0}
    assert task_backlog([queue("tasks", 1, 2), None, queue("more", 4)], counts) == 12
    assert task_backlog([], counts) == 0
    assert task_backlog([queue("new", 9)], counts) == 0  # not counted yet


@pytest.mark.parametrize("kwargs, autoscaled, bounds", [
    ({}, False, (2, 2)),                           # today's: fixed at count
    ({"count": 5}, False, (5, 5)),
    ({"min_count": 0}, True, (0, 2)),              # 0 to count
    ({"max_count": 10}, True, (2, 10)),            # count to 10
    ({"min_count": 5}, True, (5, 5)),              # count moves up to the floor
    ({"max_count": 1}, True, (1, 1)),              # ... and down to the ceiling
    ({"min_count": 0, "max_count": 2, "count": 7}, True, (0, 2)),
])
def test_the_configured_bounds(kwargs, autoscaled, bounds):
    config = ConsumerConfig(**kwargs)
    assert (config.autoscaled, config.bounds) == (autoscaled, bounds)
    assert ConsumerRule.of(config) == ConsumerRule(*bounds, 8, 60.0, autoscaled)


@pytest.mark.parametrize("kwargs", [
    {"min_count": 3, "max_count": 2},
    {"min_count": -1},
    {"max_count": 1001},
    {"count": -1},
    {"min_count": True},
    {"max_count": 2.0},
    {"scale_down_idle_s": -1.0},
])
def test_bounds_out_of_order_or_range_are_refused(kwargs):
    with pytest.raises(ConfigError):
        ConsumerConfig(**kwargs)
