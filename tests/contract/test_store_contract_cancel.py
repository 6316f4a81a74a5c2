"""Cancelling tasks by id: a task no consumer holds ends at once; a running one is
flagged, and its consumer's end (or the receive that finds it again) ends it cancelled."""

from rayq.core.codec.model import Ending
from rayq.core.codec.task_ids import TaskState
from rayq.core.codec.tasks import encode_result
from rayq.core.storage.outcomes import CancelResult
from rayq.core.storage.writes import Cancel, ChangeVisibility, Extend, Finish, Put
from tests.contract.helpers import received
from tests.contract.test_store_contract_task_ids import tasks


def state(store, task_id="t1"):
    [found] = store.tasks("acme", [task_id])
    return found.info.state


def ending(store, message_id):
    [found] = store.task_ends([message_id])
    return found[0] if found else found


def test_a_queued_task_ends_cancelled_at_once_and_is_never_received(store):
    [mid] = store.run(Put(0, tasks("t1"), account="acme"))
    assert store.run(Cancel("acme", "t1")) is CancelResult.CANCELLED
    assert state(store) is TaskState.CANCELLED and ending(store, mid) is Ending.CANCELLED
    assert received(store, 0, 1, 30) == [] and store.count(0) == 0
    assert store.run(Cancel("acme", "t1")) is CancelResult.ENDED


def test_a_delayed_task_ends_cancelled_at_once(store):
    [mid] = store.run(Put(0, tasks("t1", delay_s=60), account="acme"))
    assert store.run(Cancel("acme", "t1")) is CancelResult.CANCELLED
    assert ending(store, mid) is Ending.CANCELLED and store.count(0) == 0


def test_a_task_waiting_for_its_retry_is_queued_and_ends_cancelled_at_once(store):
    [mid] = store.run(Put(0, tasks("t1"), account="acme"))
    [got] = received(store, 0, 1, 30)
    store.run(ChangeVisibility(got.receipt, 60, usage=b"report"))  # a retry, in 60 s
    assert state(store) is TaskState.QUEUED
    assert store.run(Cancel("acme", "t1")) is CancelResult.CANCELLED
    assert ending(store, mid) is Ending.CANCELLED


def test_a_running_task_is_flagged_told_by_its_heartbeat_and_ended_by_its_consumer(store):
    [mid] = store.run(Put(0, tasks("t1"), account="acme"))
    [got] = received(store, 0, 1, 30)
    receipt, cancelled = store.run(Extend(got.receipt, 30))
    assert not cancelled
    assert store.run(Cancel("acme", "t1")) is CancelResult.RUNNING
    assert state(store) is TaskState.RUNNING
    receipt, cancelled = store.run(Extend(receipt, 30))
    assert cancelled
    store.run(Finish(receipt, encode_result(1, "report")))  # what the consumer made of it
    assert state(store) is TaskState.CANCELLED and ending(store, mid) is Ending.CANCELLED
    assert store.run(Cancel("acme", "t1")) is CancelResult.ENDED


def test_a_running_task_whose_consumer_vanished_ends_cancelled_when_found_again(store, clock):
    [mid] = store.run(Put(0, tasks("t1"), account="acme"))
    received(store, 0, 1, 30)
    assert store.run(Cancel("acme", "t1")) is CancelResult.RUNNING
    clock.advance(31)  # its visibility lapsed: no consumer holds it
    assert received(store, 0, 1, 30) == []
    assert ending(store, mid) is Ending.CANCELLED and store.count(0) == 0


def test_an_unknown_or_other_accounts_task_is_not_found(store):
    store.run(Put(0, tasks("t1"), account="acme"))
    assert store.run(Cancel("acme", "nope")) is None
    assert store.run(Cancel("globex", "t1")) is None
