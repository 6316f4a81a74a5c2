"""The queue manager's rules (rayq.core.control.managing, rayq.core.control.scaling) on tables of cases
and a fake clock."""

import pytest

from rayq.config import ScalingConfig
from rayq.core.auth.accounts import ADMIN
from rayq.core.control.managing import (check_may_create, check_task_spec, check_visible,
                                concurrency_limits, consumers_to_change, ids_by_shard,
                                indexes_by_name, is_registration, may_see, shard_depths,
                                visible_names)
from rayq.core.codec.model import SubqueueState
from rayq.core.control.scaling import OpRates, QuietTracker, SubqueueLoad, loads_of
from rayq.core.codec.tasks import TaskSpec
from rayq.errors import AuthError, InvalidMessage, QueueNotFound
from rayq.testing import FakeClock
from tests.unit.layouts import queue_info

ACME = queue_info("orders", {1: 0}, owner="acme")
TASKS = queue_info("tasks", {2: 1})            # the admin's task queue
PLAIN = queue_info("jobs", {3: 0})             # the admin's own plain queue


@pytest.mark.parametrize("account, queue, owned, seen", [
    ("acme", ACME, False, True),     # its own
    ("acme", ACME, True, True),
    (ADMIN, ACME, True, True),       # the admin sees every account's
    ("bob", ACME, False, False),     # not another account's
    ("bob", TASKS, False, True),     # a task queue, to submit to
    ("bob", TASKS, True, False),     # but not to own (delete, clear)
    ("bob", PLAIN, False, False),    # the admin's plain queues stay the admin's
    ("acme", None, False, False),    # no such queue
])
def test_who_may_see_a_queue(account, queue, owned, seen):
    assert may_see(account, queue, ["tasks"], owned=owned) is seen


def test_a_queue_an_account_may_not_see_is_reported_missing_in_the_same_words():
    assert check_visible("acme", "orders", ACME, []) is ACME
    with pytest.raises(QueueNotFound) as hidden:
        check_visible("bob", "acme/orders", ACME, [])
    with pytest.raises(QueueNotFound) as missing:
        check_visible("bob", "acme/orders", None, [])
    assert str(hidden.value) == str(missing.value)


@pytest.mark.parametrize("account, owner, error", [
    ("acme", "acme", None), (ADMIN, "acme", None), ("acme", "bob", AuthError),
    (ADMIN, "ghost", InvalidMessage), ("ghost", "ghost", InvalidMessage),
])
def test_an_account_creates_queues_in_its_own_existing_namespace(account, owner, error):
    accounts = {ADMIN, "acme", "bob"}
    if error is None:
        check_may_create(account, owner, accounts)
    else:
        with pytest.raises(error):
            check_may_create(account, owner, accounts)


def test_list_queues_shows_the_admin_everything_and_an_account_its_own():
    queues = [ACME, TASKS, queue_info("b", {4: 0}, owner="acme")]
    every = ["acme/b", "acme/orders", "tasks"]
    assert visible_names(ADMIN, queues, every) == every
    assert visible_names("acme", queues, every) == ["b", "orders"]
    assert visible_names("bob", queues, every) == []


SPEC = TaskSpec("report", "tasks", concurrency=2)


@pytest.mark.parametrize("account, known, registers, error", [
    (ADMIN, None, True, None),
    (ADMIN, TaskSpec("report", "tasks"), True, None),   # the admin may change a spec
    ("acme", SPEC, False, None),                        # the same spec again: a no-op
    ("acme", None, None, AuthError),
    ("acme", TaskSpec("report", "tasks"), None, AuthError),
])
def test_only_the_admin_registers_handlers(account, known, registers, error):
    if error is None:
        assert is_registration(account, SPEC, known) is registers
    else:
        with pytest.raises(error):
            is_registration(account, SPEC, known)


def test_subqueues_group_by_shard_and_depths_sum_per_shard():
    a = queue_info("a", {1: 0, 2: 1, 3: 0})
    b = queue_info("b", {4: 1, 5: 7})           # shard 7 is not one of ours
    assert ids_by_shard(a.subqueues) == {0: [1, 3], 1: [2]}
    assert shard_depths([a, b], {1: 10, 2: 5, 3: 1, 5: 100}, shards=3) == {0: 11, 1: 5, 2: 0}


@pytest.mark.parametrize("key_mode, limits", [
    ("type", {"report": 2}), ("tenant", {}), ("tenant_type", {}),
])
def test_concurrency_limits_are_per_key_only_when_keys_are_types(key_mode, limits):
    specs = [SPEC, TaskSpec("other", "tasks")]
    assert concurrency_limits(specs, key_mode) == limits


@pytest.mark.parametrize("total, running, start, stop", [
    (3, [], [0, 1, 2], []), (2, [0, 1, 2, 3], [], [2, 3]), (3, [0, 2], [1], []), (0, [0], [], [0]),
])
def test_consumers_are_started_and_stopped_to_run_exactly_the_wanted_indexes(total, running,
                                                                               start, stop):
    assert consumers_to_change(total, running) == (start, stop)


def test_operation_rates_come_from_counters_between_two_readings_on_a_fake_clock():
    clock, rates = FakeClock(), OpRates()
    rates.observe({1: 100}, {}, clock.monotonic())
    assert rates.of(1) == (0.0, 0.0)            # a first reading has no rate
    assert rates.of(9) == (0.0, 0.0)            # never read
    clock.advance(2.0)
    rates.observe({1: 300}, {1: 4}, clock.monotonic())
    assert rates.of(1) == (100.0, 2.0)
    rates.observe({1: 301}, {1: 4}, clock.monotonic())   # no time passed: the floor span
    assert rates.of(1) == (1 / OpRates.MIN_SPAN_S, 0.0)


def test_quiet_time_accumulates_until_a_subqueue_gets_busy_or_its_queue_retires_one():
    config = ScalingConfig(small_count=10, idle_ops_per_s=1.0)
    clock, quiet = FakeClock(), QuietTracker(config)

    def load(sq, count):
        return SubqueueLoad(sq, 0, SubqueueState.ALL, 1, count)

    assert quiet.quiet_for([load(1, 0), load(2, 0)], clock.now()) == {1: 0.0, 2: 0.0}
    clock.advance(30)
    busy = SubqueueLoad(2, 0, SubqueueState.ALL, 1, 5_000, ops_per_s=5_000.0)
    assert quiet.quiet_for([load(1, 0), busy], clock.now()) == {1: 30.0}
    clock.advance(10)
    assert quiet.quiet_for([load(1, 0), load(2, 0)], clock.now()) == {1: 40.0, 2: 0.0}
    quiet.restart([1, 2])
    clock.advance(5)
    assert quiet.quiet_for([load(1, 0)], clock.now()) == {1: 0.0}


def test_scaling_sees_a_queues_subqueues_but_the_dedicated_ones():
    queue = queue_info("q", {1: 0, 2: 1, 3: 0}, dedicated={3: ("t", "acme")},
                       states={2: SubqueueState.NO_PUT})
    rates = OpRates()
    rates.observe({1: 0}, {}, 0.0)
    rates.observe({1: 50}, {}, 1.0)
    assert loads_of(queue, {1: 7}, rates) == [
        SubqueueLoad(1, 0, SubqueueState.ALL, 1, 7, 50.0, 0.0),
        SubqueueLoad(2, 1, SubqueueState.NO_PUT, 1, 0, 0.0, 0.0)]


def test_consumer_indexes_come_from_names_with_the_prefix_and_a_number():
    names = ["rayq-consumer-0", "rayq-consumer-12", "rayq-consumer-x", "rayq-manager",
             "rayq-consumer-"]
    assert indexes_by_name(names, "rayq-consumer-") == {0: "rayq-consumer-0",
                                                        12: "rayq-consumer-12"}


@pytest.mark.parametrize("spec, error", [
    (SPEC, None), ({"type": "report"}, InvalidMessage), (None, InvalidMessage),
])
def test_a_task_registration_takes_a_task_spec(spec, error):
    if error is None:
        assert check_task_spec(spec) is spec
    else:
        with pytest.raises(error):
            check_task_spec(spec)
