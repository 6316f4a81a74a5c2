"""Outcomes of task messages and key exclusion, checked against every store."""

import dataclasses

import pytest

from rayq.config import StoreConfig
from rayq.core.codec.model import Ending
from rayq.errors import InvalidMessage, ReceiptInvalid
from tests.contract.helpers import message

DLQ = 99


def task(value=b"call", **fields):
    return dataclasses.replace(message(value, **fields), task=True)


def test_finish_deletes_the_task_and_records_its_outcome_once(store):
    [mid] = store.put(0, [task()])
    assert store.outcome(mid) is None
    [got] = store.receive(0, 1, 30)
    store.finish(got.receipt, b"result")
    assert store.outcome(mid) == (Ending.RESULT, b"result")
    assert store.count(0) == 0
    assert store.take_finished() == [(mid, Ending.RESULT, b"result")]
    assert store.take_finished() == []


def test_a_stale_receipt_cannot_finish_a_task_someone_else_holds(store, clock):
    [mid] = store.put(0, [task()])
    [first] = store.receive(0, 1, 5)
    clock.advance(6)
    [second] = store.receive(0, 1, 5)
    with pytest.raises(ReceiptInvalid):
        store.finish(first.receipt, b"late")
    store.finish(second.receipt, b"on time")
    assert store.outcome(mid) == (Ending.RESULT, b"on time")


def test_a_last_failure_moves_the_task_to_the_dead_letter_subqueue_with_its_error(store):
    [mid] = store.put(0, [task()])
    [got] = store.receive(0, 1, 30)
    store.finish(got.receipt, b"error", dead_letter=DLQ)
    assert store.count(0) == 0 and store.count(DLQ) == 1
    assert store.outcome(mid) == (Ending.RESULT, b"error")
    [dead] = store.receive(DLQ, 1, 30)
    store.delete([dead.receipt])  # the first ending stays
    assert store.outcome(mid) == (Ending.RESULT, b"error")


def test_a_task_dead_lettered_by_receive_records_that_it_died(store, clock):
    [mid] = store.put(0, [task()])
    store.receive(0, 1, 1, max_receives=1, dead_letter=DLQ)
    clock.advance(2)
    assert store.receive(0, 1, 1, max_receives=1, dead_letter=DLQ) == []
    assert store.outcome(mid) == (Ending.DEAD, b"")


@pytest.mark.parametrize("end", ["expire", "delete", "clear"])
def test_a_task_that_leaves_without_a_result_says_how(store, clock, end):
    [mid] = store.put(0, [task(ttl_s=10)])
    if end == "expire":
        clock.advance(11)
        store.collect_expired()
        expected = Ending.EXPIRED
    elif end == "delete":
        [got] = store.receive(0, 1, 30)
        store.delete([got.receipt])
        expected = Ending.DELETED
    else:
        store.clear(0)
        expected = Ending.DELETED
    assert store.outcome(mid) == (expected, b"")


def test_plain_messages_record_no_outcome(store):
    [mid] = store.put(0, [message()])
    [got] = store.receive(0, 1, 30)
    store.delete([got.receipt])
    assert store.outcome(mid) is None and store.take_finished() == []


def test_outcomes_are_collected_after_their_time_to_live(make_store, clock):
    store = make_store(StoreConfig(outcome_ttl_s=60))
    [mid] = store.put(0, [task()])
    [got] = store.receive(0, 1, 30)
    store.finish(got.receipt, b"r")
    clock.advance(61)
    store.collect_expired()
    assert store.outcome(mid) is None


def test_a_bad_finish_changes_nothing(store):
    [mid] = store.put(0, [task()])
    [got] = store.receive(0, 1, 30)
    for bad in [dict(outcome="not bytes"), dict(outcome=b"x", dead_letter=-1)]:
        with pytest.raises(InvalidMessage):
            store.finish(got.receipt, **bad)
    assert store.outcome(mid) is None and store.count(0) == 1
    store.finish(got.receipt, b"fine")
    with pytest.raises(InvalidMessage):
        store.outcome(12345)


def test_excluded_keys_are_left_for_later(store):
    store.put(0, [message("a", key="pdf"), message("b", key="csv")])
    [got] = store.receive(0, 5, 30, exclude=["pdf"])
    assert got.key == "csv"
    [later] = store.receive(0, 5, 30)
    assert later.key == "pdf"


def test_a_deferred_message_comes_back_later_without_using_up_a_delivery(store, clock):
    store.put(0, [message()])
    [got] = store.receive(0, 1, 30, max_receives=1, dead_letter=DLQ)
    store.defer(got.receipt, 2)
    assert store.receive(0, 1, 30, max_receives=1, dead_letter=DLQ) == []
    clock.advance(2)
    [again] = store.receive(0, 1, 30, max_receives=1, dead_letter=DLQ)
    assert again.dequeue_count == 1 and store.count(DLQ) == 0
    with pytest.raises(ReceiptInvalid):
        store.defer(got.receipt, 1)


def test_usage_reports_are_kept_until_taken_oldest_first_and_taken_once(store, clock):
    store.record_usage(b"first")
    clock.advance(1)
    store.record_usage(b"second")
    assert store.take_usage(1) == [b"first"]
    assert store.take_usage() == [b"second"]
    assert store.take_usage() == []


@pytest.mark.parametrize("report", [b"", b"x" * 4097, "text"])
def test_a_malformed_usage_report_is_refused(store, report):
    with pytest.raises(InvalidMessage):
        store.record_usage(report)
    assert store.take_usage() == []


@pytest.mark.parametrize("end", ["finish", "retry", "defer"])
def test_an_end_keeps_its_usage_report_and_a_stale_one_keeps_nothing(store, clock, end):
    store.put(0, [task()])
    [first] = store.receive(0, 1, 5)
    clock.advance(6)
    [second] = store.receive(0, 1, 5)
    calls = {"finish": lambda r, u: store.finish(r, b"result", usage=u),
             "retry": lambda r, u: store.change_visibility(r, 1, usage=u),
             "defer": lambda r, u: store.defer(r, 1, usage=u)}
    with pytest.raises(ReceiptInvalid):
        calls[end](first.receipt, b"stale")
    calls[end](second.receipt, b"report")
    assert store.take_usage() == [b"report"]


def test_waiting_usage_is_seen_without_taking_it(store):
    assert not store.usage_waiting()
    store.record_usage(b"report")
    assert store.usage_waiting() and store.usage_waiting()
    store.take_usage()
    assert not store.usage_waiting()
