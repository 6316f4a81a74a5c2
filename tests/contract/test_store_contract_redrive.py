"""Redrive: dead letters moved back to their queue's subqueue on the same shard, checked
against every store."""

import dataclasses

import pytest

from rayq.core.codec.model import Ending, SubqueueState, to_us
from rayq.core.codec.task_ids import TaskState
from rayq.core.codec.tasks import encode_error, encode_result
from rayq.core.codec.wire import attrs_of, encode_put
from rayq.core.storage import layout
from rayq.core.storage.writes import Finish, Put, Redrive
from rayq.errors import InvalidMessage, QueueDisabled
from tests.contract.helpers import batch, message, received, values

QUEUE, DLQ, OTHER = 0, 9, 5


def tasks(*ids, type="report"):
    """A put buffer of one task per id."""
    made = [dataclasses.replace(message(f"call {i}", type=type), task=True) for i in ids]
    return encode_put([(attrs_of(m), m.body, task_id) for m, task_id in zip(made, ids)])


def dead_letter(store, clock, n=1):
    """Receive up to ``n`` messages of QUEUE once, let them lapse, and receive again with
    max_receives=1: they move to the DLQ (as a consumer's receive moves them)."""
    got = received(store, QUEUE, n, 1)
    clock.advance(2)
    assert received(store, QUEUE, n, 1, max_receives=1, dead_letter=DLQ) == []
    return got


def test_a_dead_letter_moves_back_visible_at_once_never_received_and_otherwise_as_it_was(
        store, clock):
    [mid] = store.run(Put(QUEUE, batch(message("hello", key="k1", tenant="acme",
                                               type="report"))))
    [first] = dead_letter(store, clock)
    assert (store.count(QUEUE), store.count(DLQ)) == (0, 1)
    clock.advance(5)
    assert store.run(Redrive(DLQ, QUEUE, 100)) == (1, to_us(clock.now()), None)
    assert (store.count(QUEUE), store.count(DLQ)) == (1, 0)
    [again] = received(store, QUEUE, 1, 30)
    assert (again.id, values([again]), again.tenant, again.type, again.key) == \
        (mid, ["hello"], "acme", "report", "k1")
    assert again.dequeue_count == 1 and again.enqueued_at == first.enqueued_at
    assert again.first_received_at_s == pytest.approx(clock.now())  # its first receive anew
    assert store.stats().redriven == 1


def test_a_failed_task_redriven_is_queued_again_under_its_id_and_its_next_end_is_recorded(
        store, clock):
    [mid] = store.run(Put(QUEUE, tasks("t1"), account="acme"))
    [got] = received(store, QUEUE, 1, 30)
    store.run(Finish(got.receipt, encode_error("ValueError", "no"), dead_letter=DLQ))
    [found] = store.tasks("acme", ["t1"])
    assert (found.info.state, found.info.attempts) == (TaskState.FAILED, 1)
    store.take_finished()
    assert store.run(Redrive(DLQ, QUEUE, 10))[0] == 1
    assert store.outcome(mid) is None
    assert store.take_finished() == [(mid, None, b"")]  # the desks forget the old end
    [found] = store.tasks("acme", ["t1"])
    assert found.message_id == mid
    assert (found.info.state, found.info.attempts, found.info.started_at,
            found.info.ended_at) == (TaskState.QUEUED, 0, None, None)
    assert store.run(Put(QUEUE, tasks("t1"), account="acme")) == [mid]  # the same task
    assert store.count(QUEUE) == 1
    clock.advance(3)
    [got] = received(store, QUEUE, 1, 30)
    assert got.id == mid and got.dequeue_count == 1
    store.run(Finish(got.receipt, encode_result(7, "report")))
    assert store.outcome(mid) == (Ending.RESULT, encode_result(7, "report"))
    [found] = store.tasks("acme", ["t1"])
    assert (found.info.state, found.info.attempts) == (TaskState.SUCCEEDED, 1)
    assert found.info.started_at == pytest.approx(clock.now())


def test_a_task_dead_lettered_by_receive_forgets_that_it_died(store, clock):
    [mid] = store.run(Put(QUEUE, tasks("t1"), account="acme"))
    dead_letter(store, clock)
    assert store.outcome(mid) == (Ending.DEAD, b"")
    store.run(Redrive(DLQ, QUEUE, 10))
    assert store.outcome(mid) is None
    [found] = store.tasks("acme", ["t1"])
    assert found.info.state is TaskState.QUEUED


def test_the_forgotten_outcome_leaves_no_expiry_entry_behind(store, clock):
    def expiry_entries():
        return store.kv.read(lambda txn: list(txn.scan_keys("outcome_expiry", b"")))

    [mid] = store.run(Put(QUEUE, tasks("t1"), account="acme"))
    dead_letter(store, clock)
    assert len(expiry_entries()) == 1
    store.run(Redrive(DLQ, QUEUE, 10))
    assert expiry_entries() == []
    clock.advance(7)
    [got] = received(store, QUEUE, 1, 30)
    store.run(Finish(got.receipt, encode_result(1, "report")))
    assert expiry_entries() == [layout.outcome_expiry_key(
        to_us(clock.now() + store.config.outcome_ttl_s), mid)]


def test_a_dead_letter_someone_received_stays_until_it_is_visible_again(store, clock):
    store.run(Put(QUEUE, batch(message("a"), message("b"))))
    dead_letter(store, clock, 2)
    [held] = received(store, DLQ, 1, 10)
    assert store.run(Redrive(DLQ, QUEUE, 10))[0] == 1 and store.count(DLQ) == 1
    [other] = received(store, QUEUE, 10, 30)
    assert other.id != held.id
    clock.advance(11)
    assert store.run(Redrive(DLQ, QUEUE, 10))[0] == 1 and store.count(DLQ) == 0
    [back] = received(store, QUEUE, 10, 30)
    assert back.id == held.id and back.dequeue_count == 1


def test_dead_letters_that_came_after_the_start_wait_for_the_next_redrive(store, clock):
    store.run(Put(QUEUE, batch(message("early"))))
    dead_letter(store, clock)
    until = to_us(clock.now())
    clock.advance(1)
    store.run(Put(QUEUE, batch(message("late"))))
    dead_letter(store, clock)
    assert store.count(DLQ) == 2
    assert store.run(Redrive(DLQ, QUEUE, 10, until_us=until))[:2] == (1, until)
    assert values(received(store, QUEUE, 10, 30)) == ["early"]
    assert store.run(Redrive(DLQ, QUEUE, 10))[0] == 1


def test_a_type_redrive_moves_that_type_only(store, clock):
    store.run(Put(QUEUE, batch(message("r1", type="report"), message("e1", type="email"),
                               message("r2", type="report"))))
    dead_letter(store, clock, 3)
    assert store.run(Redrive(DLQ, QUEUE, 10, type_="report"))[0] == 2
    assert sorted(values(received(store, QUEUE, 10, 30))) == ["r1", "r2"]
    assert values(received(store, DLQ, 10, 30)) == ["e1"]


def test_a_redrive_looks_at_limit_rows_a_call_and_goes_on_from_its_cursor(store, clock):
    store.run(Put(QUEUE, batch(*(message(str(i)) for i in range(5)))))
    dead_letter(store, clock, 5)
    moved, until, after = store.run(Redrive(DLQ, QUEUE, 2))
    calls, total = 1, moved
    while after is not None:
        moved, until, after = store.run(Redrive(DLQ, QUEUE, 2, until_us=until, after=after))
        calls, total = calls + 1, total + moved
    assert (total, calls) == (5, 3)
    assert sorted(values(received(store, QUEUE, 10, 30))) == [str(i) for i in range(5)]


def test_an_expired_dead_letter_is_left_for_the_expiry_collector(store, clock):
    store.run(Put(QUEUE, batch(message("short", ttl_s=10), message("long"))))
    dead_letter(store, clock, 2)
    clock.advance(10)
    assert store.run(Redrive(DLQ, QUEUE, 10))[0] == 1
    assert values(received(store, QUEUE, 10, 30)) == ["long"]


@pytest.mark.parametrize("write", [
    Redrive(DLQ, DLQ, 10), Redrive(DLQ, QUEUE, 0), Redrive(DLQ, QUEUE, "ten"),
    Redrive(-1, QUEUE, 10), Redrive(DLQ, QUEUE, 10, type_=""),
    Redrive(DLQ, QUEUE, 10, until_us=-5), Redrive(DLQ, QUEUE, 10, after=b"not a key"),
    Redrive(DLQ, QUEUE, 10, after=layout.row_key(OTHER, 1, 0, 1)),
])
def test_bad_fields_are_refused_and_nothing_moves(store, clock, write):
    store.run(Put(QUEUE, batch(message())))
    dead_letter(store, clock)
    with pytest.raises(InvalidMessage):
        store.run(write)
    assert (store.count(QUEUE), store.count(DLQ)) == (0, 1)


@pytest.mark.parametrize("state", [SubqueueState.NO_PUT, SubqueueState.DISABLED])
def test_a_target_that_takes_no_messages_refuses_a_redrive(store, clock, state):
    store.run(Put(QUEUE, batch(message())))
    dead_letter(store, clock)
    store.set_state(OTHER, state)
    with pytest.raises(QueueDisabled):
        store.run(Redrive(DLQ, OTHER, 10))
    store.purge([OTHER + 1])
    with pytest.raises(QueueDisabled):
        store.run(Redrive(DLQ, OTHER + 1, 10))
    assert store.count(DLQ) == 1
