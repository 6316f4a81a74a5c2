"""The records of a shard's writes (rayq.core.storage.writes): which group commits a
shard may run on its event loop, which polls a write wakes, and the compact form in
which the ends of deliveries cross Ray and the local channel."""

import pytest

from rayq.core.storage.writes import (ENDS, SMALL_GROUP, SMALL_PUT_BYTES, SMALL_ROWS,
                                      ChangeVisibility, Clear, CollectExpired, Defer, Delete,
                                      Finish, MoveMatching, Put, Receive, RecordUsage, Sweep,
                                      Redrive, TakeUsage, compact, decode_ends, small_group)
from rayq.errors import InvalidMessage


def test_a_few_small_writes_are_a_small_group():
    assert small_group([Put(3, b"x" * 2000), Receive(3, 10, 30.0), Delete(["r1", "r2"]),
                        None])  # None: a signed read's nonce alone
    assert small_group([Finish("r", b"out"), Defer("r", 1.0), ChangeVisibility("r", 2.0),
                        RecordUsage(b"report")])


def test_a_large_put_receive_or_delete_is_not():
    assert not small_group([Put(3, b"x" * (SMALL_PUT_BYTES + 1))])
    assert not small_group([Receive(3, SMALL_ROWS + 1, 30.0)])
    assert not small_group([Delete(["r"] * (SMALL_ROWS + 1))])


def test_too_many_writes_or_an_unbounded_one_is_not():
    assert not small_group([Delete(["r"])] * (SMALL_GROUP + 1))
    assert not small_group([None] * (SMALL_GROUP + 1))
    for unbounded in (Sweep("t", "acme", 7, 10_000), CollectExpired(10_000), TakeUsage(),
                      Clear(3), MoveMatching(1, 2, "t", "acme", 10_000)):
        assert not small_group([unbounded])


@pytest.mark.parametrize("write", [Put(3, "not bytes"), Receive(3, "ten"), Delete("r")])
def test_fields_of_the_wrong_type_make_a_write_large_not_a_failure(write):
    assert not write.small()  # its run refuses it with InvalidMessage, off the event loop


def test_a_put_wakes_a_poll_of_its_subqueue_per_message_stored_and_nothing_else_wakes_any():
    assert list(Put(3, b"batch").wakes(["id1", "id2"])) == [(3, 2)]
    assert list(Receive(3).wakes(b"delivered")) == []
    assert list(Sweep("t", "acme", 7, 10).wakes(4)) == []


@pytest.mark.parametrize("write, subqueue", [
    (Put(3, b""), 3), (Receive(4), 4), (Clear(5), 5), (Sweep("t", "acme", 6, 10), 6),
    (MoveMatching(7, 8, "t", "acme", 10), 7), (Delete(["r"]), None), (Finish("r", b""), None),
])
def test_a_write_names_the_subqueue_whose_load_it_adds_to(write, subqueue):
    assert write.loads() == subqueue


@pytest.mark.parametrize("end, form", [
    (Finish("r", b"out"), ("finish", ("r", b"out", None, None))),
    (Finish("r", b"out", 9, b"report"), ("finish", ("r", b"out", 9, b"report"))),
    (ChangeVisibility("r", 2.5), ("change_visibility", ("r", 2.5, None))),
    (Defer("r", 0.5, b"report"), ("defer", ("r", 0.5, b"report"))),
    (RecordUsage(b"report"), ("record_usage", (b"report",))),
])
def test_an_end_crosses_as_its_name_and_fields_and_is_read_back_the_same(end, form):
    assert compact(end) == form
    assert decode_ends([form]) == [end]
    assert decode_ends([[form[0], list(form[1])]]) == [end]  # as the local channel's frames


def test_the_ends_are_finish_defer_change_visibility_record_usage_and_extend():
    assert set(ENDS) == {"finish", "defer", "change_visibility", "record_usage", "extend"}


def test_an_end_sent_without_its_usage_report_has_none():
    assert decode_ends([("finish", ("r", b"x", None))]) == [Finish("r", b"x")]


@pytest.mark.parametrize("calls", [
    "not a list", [("finish",)], [("delete", ("r",))], [("finish", "r")],
    [("finish", ("r", b"x", None)), ("drop_all", ())],
    [("finish", ("r",))], [("record_usage", (b"a", b"b"))], [("put", (0, b""))],
])
def test_a_malformed_batch_of_ends_is_refused_whole(calls):
    with pytest.raises(InvalidMessage, match="end_many"):
        decode_ends(calls)


def test_a_redrive_is_small_when_it_looks_at_few_rows_and_wakes_a_poll_of_its_target_per_message():
    assert small_group([Redrive(9, 3, SMALL_ROWS)])
    assert not small_group([Redrive(9, 3, SMALL_ROWS + 1)])
    assert not Redrive(9, 3, "all").small()
    assert list(Redrive(9, 3, 10).wakes((4, 1_000, None))) == [(3, 4)]
    assert Redrive(9, 3, 10).loads() == 3
