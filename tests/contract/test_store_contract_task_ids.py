"""Tasks by id: idempotent puts, lookups per account and the state a task is in,
checked against every store."""

import dataclasses

import pytest

from rayq.config import StoreConfig
from rayq.core.codec.task_ids import TaskState
from rayq.core.codec.tasks import encode_error, encode_result
from rayq.core.codec.wire import attrs_of, encode_put
from rayq.errors import InvalidMessage
from rayq.core.storage.writes import CollectExpired, Finish, Put
from tests.contract.helpers import message, received

DLQ = 99


def tasks(*ids, tenant="acme", delay_s=0.0):
    """A put buffer of one task per id."""
    made = [dataclasses.replace(message(b"call", tenant=tenant, delay_s=delay_s), task=True)
            for _ in ids]
    return encode_put([(attrs_of(m), m.body, task_id) for m, task_id in zip(made, ids)])


def test_a_task_put_again_under_its_id_is_the_same_task_and_stored_once(store):
    [first] = store.run(Put(0, tasks("t1"), account="acme"))
    again = store.run(Put(0, tasks("t1", "t2", "t2"), account="acme"))
    assert again[0] == first and again[1] == again[2] != first
    assert store.count(0) == 2


def test_ids_belong_to_their_account(store):
    [mine] = store.run(Put(0, tasks("t1"), account="acme"))
    [theirs] = store.run(Put(0, tasks("t1", tenant="globex"), account="globex"))
    assert mine != theirs and store.count(0) == 2
    [found] = store.tasks("globex", ["t1"])
    assert found.message_id == theirs and found.info.tenant == "globex"
    assert store.tasks("initech", ["t1"]) == [None]


def test_a_task_is_queued_then_running_then_succeeded_with_its_times(store, clock):
    store.run(Put(0, tasks("t1"), account="acme"))
    submitted = clock.now()
    [found] = store.tasks("acme", ["t1"])
    assert found.info.state is TaskState.QUEUED and found.info.state == "queued"
    assert (found.info.attempts, found.info.submitted_at, found.info.started_at,
            found.info.ended_at) == (0, pytest.approx(submitted), None, None)
    clock.advance(2)
    [got] = received(store, 0, 1, 30)
    [found] = store.tasks("acme", ["t1"])
    assert found.info.state is TaskState.RUNNING and found.info.attempts == 1
    assert found.info.started_at == pytest.approx(submitted + 2)
    clock.advance(3)
    store.run(Finish(got.receipt, encode_result(7, "report")))
    [found] = store.tasks("acme", ["t1"])
    assert (found.info.state, found.info.attempts) == (TaskState.SUCCEEDED, 1)
    assert found.info.ended_at == pytest.approx(submitted + 5)
    assert found.info.done


def test_a_task_whose_run_lapsed_is_queued_again_and_one_that_failed_is_failed(store, clock):
    store.run(Put(0, tasks("t1"), account="acme"))
    received(store, 0, 1, 5)
    clock.advance(6)
    [found] = store.tasks("acme", ["t1"])
    assert (found.info.state, found.info.attempts) == (TaskState.QUEUED, 1)
    [got] = received(store, 0, 1, 5)
    store.run(Finish(got.receipt, encode_error("ValueError", "no"), dead_letter=DLQ))
    [found] = store.tasks("acme", ["t1"])
    assert (found.info.state, found.info.attempts) == (TaskState.FAILED, 2)


def test_a_task_that_expired_unrun_is_failed(store, clock):
    store.run(Put(0, tasks("t1"), account="acme"))
    clock.advance(StoreConfig().default_ttl_s + 1)
    store.run(CollectExpired())
    [found] = store.tasks("acme", ["t1"])
    assert found.info.state is TaskState.FAILED and found.info.started_at is None


def test_an_id_is_forgotten_with_its_outcome_and_may_then_be_used_again(make_store, clock):
    store = make_store(StoreConfig(outcome_ttl_s=60))
    [first] = store.run(Put(0, tasks("t1"), account="acme"))
    [got] = received(store, 0, 1, 30)
    store.run(Finish(got.receipt, encode_result(1, "report")))
    assert store.run(Put(0, tasks("t1"), account="acme")) == [first]  # kept: same task
    clock.advance(61)
    store.run(CollectExpired())
    assert store.tasks("acme", ["t1"]) == [None]
    [second] = store.run(Put(0, tasks("t1"), account="acme"))
    assert second != first and store.count(0) == 1


@pytest.mark.parametrize("task_id", ["", "x" * 257, "a\nb", 7, b"t1"])
def test_a_malformed_task_id_is_refused_and_nothing_is_stored(store, task_id):
    with pytest.raises(InvalidMessage):
        store.tasks("acme", [task_id])
    m = dataclasses.replace(message(b"call"), task=True)
    with pytest.raises(InvalidMessage):
        store.run(Put(0, encode_put([(attrs_of(m), m.body, task_id)]), account="acme"))
    assert store.count(0) == 0


def test_only_tasks_carry_ids(store):
    m = message(b"plain")
    with pytest.raises(InvalidMessage):
        store.run(Put(0, encode_put([(attrs_of(m), m.body, "t1")]), account="acme"))
    assert store.count(0) == 0


def test_task_ends_tell_a_pending_task_from_one_the_store_does_not_keep(store):
    [mid] = store.run(Put(0, tasks("t1"), account="acme"))
    other = mid.split("-")[0] + "-ffff-00"
    assert store.task_ends([mid, other, "elsewhere-1-00", mid.split("-")[0] + "-zz"]) \
        == [None, False, False, False]
    [got] = received(store, 0, 1, 30)
    store.run(Finish(got.receipt, encode_result(3, "report")))
    assert store.task_ends([mid])[0][1] == encode_result(3, "report")
