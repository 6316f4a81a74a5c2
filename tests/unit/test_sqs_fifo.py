"""FIFO queues' deduplication and sequence numbers over a KV (the memory one here)."""

import pytest

from rayq.sqs import fifo
from rayq.sqs.errors import SqsError
from rayq.testing import MemoryKV


def test_a_deduplication_id_seen_within_five_minutes_answers_the_first_send():
    dedup = fifo.Dedup(MemoryKV())
    [first] = dedup.admit("q", ["d1"], now=0.0)
    assert first == fifo.Admitted("00000000000000000001")
    dedup.record("q", [("d1", "m1", first.sequence)], now=0.0)
    assert dedup.admit("q", ["d1", "d2"], now=299.0) == [
        fifo.Admitted("00000000000000000001", "m1"), fifo.Admitted("00000000000000000002")]
    assert dedup.admit("q", ["d1"], now=300.0) == [fifo.Admitted("00000000000000000003")]
    assert dedup.admit("other", ["d1"], now=1.0) == [fifo.Admitted("00000000000000000001")]


def test_an_admitted_id_is_held_until_its_send_records_or_releases_it():
    dedup = fifo.Dedup(MemoryKV())
    [first] = dedup.admit("q", ["d1"], now=0.0)
    assert dedup.admit("q", ["d1"], now=1.0) == [fifo.Admitted(first.sequence, waiting=True)]
    dedup.record("q", [("d1", "m1", first.sequence)], now=1.0)
    assert dedup.admit("q", ["d1"], now=2.0) == [fifo.Admitted(first.sequence, "m1")]
    [held] = dedup.admit("q", ["d2"], now=2.0)
    dedup.release("q", ["d1", "d2"])  # a failed send: its own reservation goes, records stay
    assert dedup.admit("q", ["d1"], now=3.0)[0].duplicate_of == "m1"
    [again] = dedup.admit("q", ["d2"], now=3.0)
    assert not again.waiting and again.sequence > held.sequence


def test_a_reservation_its_sender_abandoned_lapses():
    dedup = fifo.Dedup(MemoryKV())
    dedup.admit("q", ["d1"], now=0.0)
    assert dedup.admit("q", ["d1"], now=fifo.RESERVED_S - 1)[0].waiting
    [taken] = dedup.admit("q", ["d1"], now=fifo.RESERVED_S)
    assert not taken.waiting and taken.duplicate_of is None


def test_a_key_repeated_in_one_batch_is_a_duplicate_of_its_first():
    dedup = fifo.Dedup(MemoryKV())
    assert dedup.admit("q", ["a", "a", "b"], now=0.0) == [
        fifo.Admitted("00000000000000000001"), fifo.Admitted("00000000000000000001", ""),
        fifo.Admitted("00000000000000000002")]


def test_old_ids_are_swept_and_sequence_numbers_only_grow():
    dedup = fifo.Dedup(MemoryKV())
    dedup.record("q", [("old", "m1", "1"), ("new", "m2", "2")], now=0.0)
    dedup.record("q", [("new", "m2", "2")], now=100.0)
    assert dedup.forget("q", now=350.0) == 1
    assert dedup.admit("q", ["new"], now=350.0)[0].duplicate_of == "m2"
    assert dedup.admit("q", ["x"], now=1.0)[0].sequence < dedup.admit("q", ["y"], 2.0)[0].sequence


def test_content_based_deduplication_hashes_the_body_and_an_id_must_be_given_otherwise():
    assert fifo.dedup_id({}, "body", content_based=True) == fifo.dedup_id({}, "body", True)
    assert fifo.dedup_id({"MessageDeduplicationId": "given"}, "body", True) == "given"
    with pytest.raises(SqsError):
        fifo.dedup_id({}, "body", content_based=False)
    with pytest.raises(SqsError):
        fifo.dedup_id({"MessageDeduplicationId": "x" * 129}, "body", False)


def test_a_fifo_send_needs_a_group_and_takes_no_delay_of_its_own():
    fifo.check_send({"MessageGroupId": "g"})
    for entry, code in (({}, "MissingParameter"),
                        ({"MessageGroupId": "g", "DelaySeconds": 5}, "InvalidParameterValue")):
        with pytest.raises(SqsError) as info:
            fifo.check_send(entry)
        assert info.value.code == code


def test_deduplication_scope_per_group_keeps_groups_apart():
    assert fifo.scope_key("d", "g1", True) != fifo.scope_key("d", "g2", True)
    assert fifo.scope_key("d", "g1", False) == fifo.scope_key("d", "g2", False)
