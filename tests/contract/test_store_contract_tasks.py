"""Outcomes of task messages and key exclusion, checked against every store."""

import dataclasses

import pytest

from rayq.config import StoreConfig
from rayq.core.codec.model import Ending
from rayq.errors import InvalidMessage, ReceiptInvalid
from rayq.core.storage.writes import (ChangeVisibility, Clear, CollectExpired, Defer, Delete,
                                      Finish, Put, RecordUsage, TakeUsage)
from tests.contract.helpers import batch, message, received

DLQ = 99


def task(value=b"call", **fields):
    return dataclasses.replace(message(value, **fields), task=True)


def test_finish_deletes_the_task_and_records_its_outcome_once(store):
    [mid] = store.run(Put(0, batch(task())))
    assert store.outcome(mid) is None
    [got] = received(store, 0, 1, 30)
    store.run(Finish(got.receipt, b"result"))
    assert store.outcome(mid) == (Ending.RESULT, b"result")
    assert store.count(0) == 0
    assert store.take_finished() == [(mid, Ending.RESULT, b"result")]
    assert store.take_finished() == []


def test_a_stale_receipt_cannot_finish_a_task_someone_else_holds(store, clock):
    [mid] = store.run(Put(0, batch(task())))
    [first] = received(store, 0, 1, 5)
    clock.advance(6)
    [second] = received(store, 0, 1, 5)
    with pytest.raises(ReceiptInvalid):
        store.run(Finish(first.receipt, b"late"))
    store.run(Finish(second.receipt, b"on time"))
    assert store.outcome(mid) == (Ending.RESULT, b"on time")


def test_a_last_failure_moves_the_task_to_the_dead_letter_subqueue_with_its_error(store):
    [mid] = store.run(Put(0, batch(task())))
    [got] = received(store, 0, 1, 30)
    store.run(Finish(got.receipt, b"error", dead_letter=DLQ))
    assert store.count(0) == 0 and store.count(DLQ) == 1
    assert store.outcome(mid) == (Ending.RESULT, b"error")
    [dead] = received(store, DLQ, 1, 30)
    store.run(Delete([dead.receipt]))  # the first ending stays
    assert store.outcome(mid) == (Ending.RESULT, b"error")


def test_a_task_dead_lettered_by_receive_records_that_it_died(store, clock):
    [mid] = store.run(Put(0, batch(task())))
    received(store, 0, 1, 1, max_receives=1, dead_letter=DLQ)
    clock.advance(2)
    assert received(store, 0, 1, 1, max_receives=1, dead_letter=DLQ) == []
    assert store.outcome(mid) == (Ending.DEAD, b"")


@pytest.mark.parametrize("end", ["expire", "delete", "clear"])
def test_a_task_that_leaves_without_a_result_says_how(store, clock, end):
    [mid] = store.run(Put(0, batch(task(ttl_s=10))))
    if end == "expire":
        clock.advance(11)
        store.run(CollectExpired())
        expected = Ending.EXPIRED
    elif end == "delete":
        [got] = received(store, 0, 1, 30)
        store.run(Delete([got.receipt]))
        expected = Ending.DELETED
    else:
        store.run(Clear(0))
        expected = Ending.DELETED
    assert store.outcome(mid) == (expected, b"")


def test_plain_messages_record_no_outcome(store):
    [mid] = store.run(Put(0, batch(message())))
    [got] = received(store, 0, 1, 30)
    store.run(Delete([got.receipt]))
    assert store.outcome(mid) is None and store.take_finished() == []


def test_outcomes_are_collected_after_their_time_to_live(make_store, clock):
    store = make_store(StoreConfig(outcome_ttl_s=60))
    [mid] = store.run(Put(0, batch(task())))
    [got] = received(store, 0, 1, 30)
    store.run(Finish(got.receipt, b"r"))
    clock.advance(61)
    store.run(CollectExpired())
    assert store.outcome(mid) is None


def test_a_bad_finish_changes_nothing(store):
    [mid] = store.run(Put(0, batch(task())))
    [got] = received(store, 0, 1, 30)
    for bad in [dict(outcome="not bytes"), dict(outcome=b"x", dead_letter=-1)]:
        with pytest.raises(InvalidMessage):
            store.run(Finish(got.receipt, **bad))
    assert store.outcome(mid) is None and store.count(0) == 1
    store.run(Finish(got.receipt, b"fine"))
    with pytest.raises(InvalidMessage):
        store.outcome(12345)


def test_excluded_keys_are_left_for_later(store):
    store.run(Put(0, batch(message("a", key="pdf"), message("b", key="csv"))))
    [got] = received(store, 0, 5, 30, exclude=["pdf"])
    assert got.key == "csv"
    [later] = received(store, 0, 5, 30)
    assert later.key == "pdf"


def test_a_deferred_message_comes_back_later_without_using_up_a_delivery(store, clock):
    store.run(Put(0, batch(message())))
    [got] = received(store, 0, 1, 30, max_receives=1, dead_letter=DLQ)
    store.run(Defer(got.receipt, 2))
    assert received(store, 0, 1, 30, max_receives=1, dead_letter=DLQ) == []
    clock.advance(2)
    [again] = received(store, 0, 1, 30, max_receives=1, dead_letter=DLQ)
    assert again.dequeue_count == 1 and store.count(DLQ) == 0
    with pytest.raises(ReceiptInvalid):
        store.run(Defer(got.receipt, 1))


def test_usage_reports_are_kept_until_taken_oldest_first_and_taken_once(store, clock):
    store.run(RecordUsage(b"first"))
    clock.advance(1)
    store.run(RecordUsage(b"second"))
    assert store.run(TakeUsage(1)) == [b"first"]
    assert store.run(TakeUsage()) == [b"second"]
    assert store.run(TakeUsage()) == []


@pytest.mark.parametrize("report", [b"", b"x" * 4097, "text"])
def test_a_malformed_usage_report_is_refused(store, report):
    with pytest.raises(InvalidMessage):
        store.run(RecordUsage(report))
    assert store.run(TakeUsage()) == []


@pytest.mark.parametrize("end", ["finish", "retry", "defer"])
def test_an_end_keeps_its_usage_report_and_a_stale_one_keeps_nothing(store, clock, end):
    store.run(Put(0, batch(task())))
    [first] = received(store, 0, 1, 5)
    clock.advance(6)
    [second] = received(store, 0, 1, 5)
    calls = {"finish": lambda r, u: store.run(Finish(r, b"result", usage=u)),
             "retry": lambda r, u: store.run(ChangeVisibility(r, 1, usage=u)),
             "defer": lambda r, u: store.run(Defer(r, 1, usage=u))}
    with pytest.raises(ReceiptInvalid):
        calls[end](first.receipt, b"stale")
    calls[end](second.receipt, b"report")
    assert store.run(TakeUsage()) == [b"report"]


def test_waiting_usage_is_seen_without_taking_it(store):
    assert not store.usage_waiting()
    store.run(RecordUsage(b"report"))
    assert store.usage_waiting() and store.usage_waiting()
    store.run(TakeUsage())
    assert not store.usage_waiting()
