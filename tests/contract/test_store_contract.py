"""The queue rules of docs/shards-and-storage.md and docs/visibility-and-receipts.md,
checked against every store."""

import pytest

from rayq.core.storage.dispatch import DispatchPolicy
from rayq.config import StoreConfig
from rayq.core.codec.model import Receipt, decode_body
from rayq.errors import ReceiptInvalid
from rayq.core.storage.writes import ChangeVisibility, Clear, CollectExpired, Defer, Delete, Put
from tests.contract.helpers import batch, message, received, values

DAY_S = 24 * 3600


def test_a_put_message_is_received_once_then_deleted_for_good(store, clock):
    [mid] = store.run(Put(0, batch(message(b"hello"))))
    [got] = received(store, 0, 10, 30)
    assert (got.id, got.body, got.dequeue_count) == (mid, message(b"hello").body, 1)
    assert received(store, 0, 10, 30) == []
    assert store.run(Delete([got.receipt])) == []
    clock.advance(31)
    assert received(store, 0, 10, 30) == [] and store.count(0) == 0


def test_a_received_message_carries_the_attributes_it_was_put_with(store, clock):
    store.run(Put(3, batch(message(tenant="acme", type="report", key="report"))))
    [got] = received(store, 3, 1, 30)
    assert (got.tenant, got.type, got.key, got.subqueue) == ("acme", "report", "report", 3)
    assert got.enqueued_at == clock.now()


def test_put_returns_distinct_ids_in_the_order_of_the_messages(store):
    ids = store.run(Put(0, batch(*[message(i) for i in range(5)])))
    ids += store.run(Put(0, batch(message(5))))
    assert len(set(ids)) == 6
    assert [m.id for m in received(store, 0, 10, 30)] == ids


@pytest.mark.parametrize("value", [
    b"", b"\x00\xff" * 10, bytearray(b"ba"), "", "héllo ✓", "\ud800 lone surrogate",
    0, -1, 2**64 - 1, 1.5, None, True, [1, "a", [b"x"]], {"k": {"nested": [None, 2.5]}},
], ids=repr)
def test_bodies_round_trip_unchanged(store, value):
    store.run(Put(0, batch(message(value))))
    [got] = received(store, 0, 1, 30)
    assert decode_body(got.body) == value
    assert type(decode_body(got.body)) is (bytes if isinstance(value, bytearray) else type(value))


def test_a_received_message_is_hidden_for_its_timeout_then_delivered_again(store, clock):
    store.run(Put(0, batch(message())))
    [first] = received(store, 0, 1, 10)
    clock.advance(9.999)
    assert received(store, 0, 1, 10) == []
    clock.advance(0.001)
    [second] = received(store, 0, 1, 10)
    assert (second.id, second.dequeue_count) == (first.id, 2)


def test_the_first_receive_time_is_set_by_the_first_receive_and_kept_by_later_ones(store,
                                                                                   clock):
    store.run(Put(0, batch(message())))
    assert store.peek(0, 1)[0].first_received_at_s is None  # never received
    first_s = clock.now()
    deliveries = [received(store, 0, 1, 10)[0]]
    clock.advance(10)
    deliveries.append(received(store, 0, 1, 10)[0])
    clock.advance(10)
    [peeked] = store.peek(0, 1)
    assert [m.first_received_at_s for m in [*deliveries, peeked]] == [first_s] * 3
    assert [m.dequeue_count for m in [*deliveries, peeked]] == [1, 2, 2]


def test_a_message_deferred_back_to_no_receives_takes_its_next_receive_as_its_first(store,
                                                                                     clock):
    store.run(Put(0, batch(message())))
    [got] = received(store, 0, 1, 10)
    store.run(Defer(got.receipt, 5))
    clock.advance(5)
    [again] = received(store, 0, 1, 10)
    assert (again.dequeue_count, again.first_received_at_s) == (1, clock.now())


def test_the_default_visibility_timeout_is_thirty_seconds(store, clock):
    store.run(Put(0, batch(message())))
    received(store, 0)
    clock.advance(29.9)
    assert received(store, 0) == []
    clock.advance(0.1)
    assert len(received(store, 0)) == 1


def test_a_receipt_stays_valid_after_its_timeout_until_the_message_is_received_again(store, clock):
    store.run(Put(0, batch(message())))
    [got] = received(store, 0, 1, 10)
    clock.advance(60)
    assert store.run(Delete([got.receipt])) == []
    assert store.count(0) == 0


def _delete(store, receipt, clock):
    store.run(Delete([receipt]))


def _receive_again(store, receipt, clock):
    clock.advance(31)
    received(store, 0, 1, 30)


def _change_visibility(store, receipt, clock):
    store.run(ChangeVisibility(receipt, 5))


@pytest.mark.parametrize("invalidate", [_delete, _receive_again, _change_visibility])
def test_a_receipt_is_invalid_once_the_message_is_deleted_received_again_or_changed(
        store, clock, invalidate):
    store.run(Put(0, batch(message())))
    [got] = received(store, 0, 1, 30)
    invalidate(store, got.receipt, clock)
    assert store.run(Delete([got.receipt])) == [got.receipt]
    with pytest.raises(ReceiptInvalid):
        store.run(ChangeVisibility(got.receipt, 10))


def test_a_receipt_of_an_earlier_delivery_is_refused_when_the_message_lies_in_the_same_row(
        store, clock):
    store.run(Put(0, batch(message("kept"))))
    [first] = received(store, 0, 1, 10)
    clock.advance(10)
    [second] = received(store, 0, 1, 0)  # visible again at the very instant the first hid it to
    assert Receipt.decode(first.receipt).row_key == Receipt.decode(second.receipt).row_key
    assert store.run(Delete([first.receipt])) == [first.receipt]  # only the nonce tells them apart
    with pytest.raises(ReceiptInvalid):
        store.run(ChangeVisibility(first.receipt, 0))
    [third] = received(store, 0, 1, 30)
    assert (third.id, third.dequeue_count) == (first.id, 3)


def test_change_visibility_returns_a_new_receipt_that_is_valid(store, clock):
    store.run(Put(0, batch(message())))
    [got] = received(store, 0, 1, 30)
    newer = store.run(ChangeVisibility(got.receipt, 100))
    assert newer != got.receipt
    clock.advance(99)
    assert received(store, 0, 1, 30) == []
    newest = store.run(ChangeVisibility(newer, 0))
    assert [m.id for m in store.peek(0)] == [got.id]
    assert store.run(Delete([newest])) == [] and store.count(0) == 0


def _forgeries(receipt: str) -> list:
    parsed = Receipt.decode(receipt)
    other_nonce = Receipt(parsed.row_key, bytes(8)).encode()
    other_row = Receipt(parsed.row_key[:-1] + b"\x7f", parsed.nonce).encode()
    return [other_nonce, other_row, "", "abc", "!" * 44, "é" * 44, receipt[:-4] + "====",
            receipt + "A", None, 42, b"bytes"]


def test_forged_or_malformed_receipts_are_invalid_and_change_nothing(store, clock):
    store.run(Put(0, batch(message("kept"))))
    [got] = received(store, 0, 1, 30)
    forged = _forgeries(got.receipt)
    assert store.run(Delete(forged)) == forged
    for receipt in forged:
        with pytest.raises(ReceiptInvalid):
            store.run(ChangeVisibility(receipt, 0))
    assert store.peek(0) == [] and store.count(0) == 1
    assert store.run(Delete([got.receipt])) == []


def test_delete_returns_only_the_invalid_receipts_of_a_batch(store):
    store.run(Put(0, batch(*[message(i) for i in range(3)])))
    a, b, c = received(store, 0, 3, 30)
    store.run(Delete([b.receipt]))
    assert store.run(Delete([a.receipt, b.receipt, "nonsense", c.receipt, a.receipt])) == [
        b.receipt, "nonsense", a.receipt]
    assert store.count(0) == 0


def test_delay_defers_the_first_visibility(store, clock):
    store.run(Put(0, batch(message("later", delay_s=10), message("now"))))
    assert values(store.peek(0, 10)) == ["now"] and store.count(0) == 2
    store.run(Delete([m.receipt for m in received(store, 0, 10, 30)]))
    clock.advance(9.999)
    assert received(store, 0, 10, 30) == []
    clock.advance(0.001)
    assert values(received(store, 0, 10, 30)) == ["later"]


@pytest.mark.parametrize("ttl_s, age_s, delivered", [
    (5, 4.999, True), (5, 5, False), (None, 7 * DAY_S - 1, True), (None, 7 * DAY_S, False),
])
def test_an_expired_message_is_never_delivered(store, clock, ttl_s, age_s, delivered):
    store.run(Put(0, batch(message(ttl_s=ttl_s))))
    clock.advance(age_s)
    assert len(received(store, 0, 1, 30)) == int(delivered)
    assert store.count(0) == int(delivered)


def test_collect_expired_removes_visible_hidden_and_delayed_expired_messages(store, clock):
    store.run(Put(0, batch(message("visible", ttl_s=5), message("hidden", ttl_s=5),
                           message("delayed", ttl_s=5, delay_s=60), message("young", ttl_s=60))))
    store.run(Put(1, batch(message("other subqueue", ttl_s=5))))
    [hidden] = received(store, 0, 1, 3600)
    clock.advance(5)
    assert store.run(CollectExpired()) == 4
    assert store.counts() == {(0, "k"): 1} and store.stats().expired == 4
    assert store.run(Delete([hidden.receipt])) == [hidden.receipt]
    assert values(received(store, 0, 10, 30)) == ["young"]


def test_collect_expired_removes_at_most_its_limit(store, clock):
    store.run(Put(0, batch(*[message(i, ttl_s=1) for i in range(5)])))
    clock.advance(1)
    assert [store.run(CollectExpired(2)) for _ in range(4)] == [2, 2, 1, 0]
    assert store.count(0) == 0


def test_a_message_received_max_receives_times_moves_to_the_dead_letter_subqueue(store, clock):
    store.run(Put(0, batch(message("poison"), message("fine", key="other"))))
    for _ in range(2):
        got = received(store, 0, 10, 10, keys=["k"], max_receives=2, dead_letter=9)
        assert values(got) == ["poison"]
        clock.advance(10)
    assert values(received(store, 0, 10, 10, max_receives=2, dead_letter=9)) == ["fine"]
    assert store.counts() == {(9, "k"): 1, (0, "other"): 1}
    assert store.stats().dead_lettered == 1
    [dead] = received(store, 9, 10, 30)
    assert (decode_body(dead.body), dead.subqueue, dead.dequeue_count) == ("poison", 9, 3)


def test_peek_shows_the_next_messages_without_hiding_them(store):
    store.run(Put(0, batch(*[message(i) for i in range(3)])))
    peeked = store.peek(0, 2)
    assert values(peeked) == [0, 1] and {m.receipt for m in peeked} == {None}
    assert {m.dequeue_count for m in peeked} == {0}
    got = received(store, 0, 3, 30)
    assert [m.id for m in got[:2]] == [m.id for m in peeked]
    assert store.peek(0, 10) == []


def test_count_and_counts_are_exact_for_visible_hidden_and_delayed_messages(store):
    store.run(Put(0, batch(message(key="a"), message(key="a", delay_s=60), message(key="b"))))
    store.run(Put(1, batch(message(key="a"))))
    received(store, 0, 1, 30, keys=["b"])
    assert (store.count(0), store.count(1), store.count(2)) == (3, 1, 0)
    assert store.counts() == {(0, "a"): 2, (0, "b"): 1, (1, "a"): 1}
    [a] = received(store, 0, 1, 30, keys=["a"])
    store.run(Delete([a.receipt]))
    assert store.counts() == {(0, "a"): 1, (0, "b"): 1, (1, "a"): 1}
    assert store.stats().messages == 3


def test_clear_deletes_every_message_of_one_subqueue_only(store):
    store.run(Put(0, batch(*[message(i, key=k) for i, k in enumerate("abab")])))
    store.run(Put(1, batch(message("stays"))))
    [hidden] = received(store, 0, 1, 30)
    assert store.run(Clear(0)) == 4
    assert store.counts() == {(1, "k"): 1} and {sq for sq, _ in store.counts()} == {1}
    assert store.run(Delete([hidden.receipt])) == [hidden.receipt]
    assert store.run(Clear(0)) == 0 and values(received(store, 1, 10, 30)) == ["stays"]


@pytest.mark.parametrize("keys, n, expected", [
    (["b", "a"], 3, ["b1", "b2", "a1"]),
    (["a", "b"], 3, ["a1", "a2", "b1"]),
    (["c", "nobody", "a"], 2, ["c1", "a1"]),
    (["b", "b"], 5, ["b1", "b2"]),
    ([], 5, []),
])
def test_a_listen_order_takes_from_the_first_key_first(store, keys, n, expected):
    store.run(Put(0, batch(*[message(f"{k}{i}", key=k) for i in (1, 2) for k in "abc"][:-1])))
    assert values(store.peek(0, n, keys=keys)) == expected
    assert values(received(store, 0, n, 30, keys=keys)) == expected


def _three_keys_interleaved(store, clock) -> None:
    store.run(Put(0, batch(message("a1", key="a"))))
    clock.advance(1)
    store.run(Put(0, batch(message("b1", key="b"), message("a2", key="a"))))
    clock.advance(1)
    store.run(Put(0, batch(message("c1", key="c"), message("b2", key="b"))))


def test_fifo_dispatch_hands_out_the_oldest_messages_first_across_keys(make_store, clock):
    store = make_store(dispatch=DispatchPolicy(mode="fifo"))
    _three_keys_interleaved(store, clock)
    assert values(received(store, 0, 4, 30)) == ["a1", "b1", "a2", "c1"]


def test_fair_dispatch_serves_each_key_before_any_key_gets_a_second_message(store, clock):
    _three_keys_interleaved(store, clock)
    assert values(received(store, 0, 4, 30)) == ["a1", "b1", "c1", "a2"]


def test_fair_dispatch_serves_a_key_with_nothing_in_flight_before_a_busy_one(store, clock):
    store.run(Put(0, batch(*[message(f"busy{i}", key="busy") for i in range(5)])))
    assert values(received(store, 0, 3, 30)) == ["busy0", "busy1", "busy2"]
    clock.advance(1)
    store.run(Put(0, batch(message("quiet", key="quiet"))))
    assert values(received(store, 0, 1, 30)) == ["quiet"]  # behind 2 older visible messages


def test_a_message_that_became_visible_again_queues_by_its_visible_time(store, clock):
    store.run(Put(0, batch(message("first"))))
    received(store, 0, 1, 10)
    clock.advance(5)
    store.run(Put(0, batch(message("second"))))
    clock.advance(5)
    store.run(Put(0, batch(message("third"))))
    assert values(received(store, 0, 3, 30)) == ["second", "first", "third"]


def test_counters_in_stats_follow_the_operations(make_store):
    store = make_store(StoreConfig())
    store.run(Put(0, batch(*[message(i) for i in range(4)])))
    got = received(store, 0, 3, 30)
    store.run(Delete([got[0].receipt, "bad"]))
    stats = store.stats()
    assert (stats.puts, stats.receives, stats.deletes, stats.messages) == (4, 3, 1, 3)
