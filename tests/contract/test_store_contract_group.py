"""Group commit, depths, enqueue windows and bounded receives, against every store."""

import pytest

from rayq.config import StoreConfig
from rayq.core.codec.model import KeyDepth
from rayq.errors import InvalidMessage, ReceiptInvalid, StoreError
from rayq.core.codec.wire import decode_delivered
from rayq.core.storage.writes import ChangeVisibility, Clear, CollectExpired, Delete, Put, Receive
from tests.contract.helpers import batch, message, received, starved_of_memory, values


def test_a_group_runs_every_write_in_order_and_returns_each_result(store):
    ids, delivered, collected = store.group([
        Put(0, batch(message("a"), message("b"))),
        Receive(0, max_messages=5, visibility_timeout_s=30),
        CollectExpired(10),
    ])
    delivered = decode_delivered(delivered)  # what crosses Ray is one buffer
    assert [m.id for m in delivered] == ids and collected == 0
    [invalid] = store.group([Delete([delivered[0].receipt, "bad"])])
    assert invalid == ["bad"] and store.count(0) == 1


def test_a_failing_write_in_a_group_is_rolled_back_alone_and_the_others_commit(store):
    results = store.group([
        Put(0, batch(message("first"))),
        Put(0, batch(message("ok"), message("bad"), key="")),
        ChangeVisibility("not a receipt", 10),
        ("drop_everything", (), {}),
        Put(1, batch(message("second"))),
    ])
    assert [type(r) for r in results[1:4]] == [InvalidMessage, ReceiptInvalid, InvalidMessage]
    assert len(results[0]) == len(results[4]) == 1
    assert store.counts() == {(0, "k"): 1, (1, "k"): 1}
    assert store.stats().puts == 2
    assert values(received(store, 0, 5, 30)) == ["first"]


def test_a_write_with_bad_fields_fails_alone_and_the_others_commit(store):
    kept, bad = store.group([Put(0, batch(message("kept"))), Clear("not a subqueue")])
    assert isinstance(bad, InvalidMessage) and len(kept) == 1
    assert store.count(0) == 1 and store.stats().puts == 1


def _break_first_blob(store) -> None:
    def drop(txn):
        [(key, _)] = list(txn.scan("blobs", b""))[:1]
        txn.delete("blobs", key)
    store.kv.transact(drop)


def test_a_write_that_fails_after_writing_leaves_no_trace(make_store):
    store = make_store(StoreConfig(blob_threshold_bytes=1024, blob_chunk_bytes=300),
                       memory_probe=starved_of_memory)
    store.run(Put(0, batch(message("fine"), message(b"x" * 2000))))
    _break_first_blob(store)
    with pytest.raises(StoreError):
        received(store, 0, 2, 30)
    late, broken, other = store.group([
        Put(0, batch(message("late"))),
        Receive(0, 2, 30),
        Put(1, batch(message("other"))),
    ])
    assert isinstance(broken, StoreError) and len(late) == len(other) == 1
    assert [(m.body, m.dequeue_count) for m in store.peek(0, 1)] == [(message("fine").body, 0)]
    assert store.counts() == {(0, "k"): 3, (1, "k"): 1}
    assert store.stats().receives == 0


def test_a_rolled_back_put_is_not_counted_in_enqueue_windows(store):
    store.group([Put(0, batch(message(), message(), ttl_us=-1_000_000)),
                 Put(0, batch(message()))])
    assert store.enqueue_counts() == {(0, "report", "acme"): [0.0] * 9 + [1.0]}


def test_depths_give_count_and_latency_of_the_oldest_visible_message_per_key(store, clock):
    t0 = clock.now()
    store.run(Put(0, batch(message(key="waiting"), message(key="waiting"), message(key="hidden"),
                           message(key="delayed", delay_s=10))))
    received(store, 0, 1, 60, keys=["hidden"])
    clock.advance(4)
    store.run(Put(2, batch(message(key="fresh"))))
    clock.advance(11)
    assert sorted(store.depths(), key=lambda d: (d.subqueue, d.key)) == [
        KeyDepth(0, "delayed", 1, 5.0, t0, 15.0, t0 + 10),  # visible 5 s, sent 15 s ago
        KeyDepth(0, "hidden", 1, 0.0, t0, 0.0, t0),
        KeyDepth(0, "waiting", 2, 15.0, t0, 15.0, t0),
        KeyDepth(2, "fresh", 1, 11.0, t0 + 4, 11.0, t0 + 4),
    ]


def test_depths_leave_out_keys_that_were_emptied(store):
    store.run(Put(0, batch(message(key="a"), message(key="b"))))
    store.run(Delete([m.receipt for m in received(store, 0, 1, 30, keys=["a"])]))
    assert [(d.key, d.count) for d in store.depths()] == [("b", 1)]


WINDOWS = StoreConfig(enqueue_window_s=60, enqueue_windows=3)


@pytest.mark.parametrize("puts, age_s, expected", [
    ([(0, "report", "acme", 2)], 0, {(0, "report", "acme"): [0.0, 0.0, 2.0]}),
    ([(0, "report", "acme", 2)], 60, {(0, "report", "acme"): [0.0, 2.0, 0.0]}),
    ([(0, "report", "acme", 2)], 179, {(0, "report", "acme"): [2.0, 0.0, 0.0]}),
    ([(0, "report", "acme", 2)], 180, {}),
    ([(0, "report", "acme", 1), (0, "mail", "acme", 3), (1, "report", "zeta", 1)], 0,
     {(0, "report", "acme"): [0.0, 0.0, 1.0], (0, "mail", "acme"): [0.0, 0.0, 3.0],
      (1, "report", "zeta"): [0.0, 0.0, 1.0]}),
])
def test_enqueue_counts_are_kept_per_subqueue_type_and_tenant_per_window(
        make_store, clock, puts, age_s, expected):
    clock.advance(60 - clock.now() % 60)  # start on a window boundary
    store = make_store(WINDOWS)
    for subqueue, type_, tenant, n in puts:
        store.run(Put(subqueue, batch(*[message(type=type_, tenant=tenant) for _ in range(n)])))
    clock.advance(age_s)
    assert store.enqueue_counts() == expected


def test_enqueue_counts_fill_one_window_after_another(make_store, clock):
    clock.advance(60 - clock.now() % 60)
    store = make_store(WINDOWS)
    for n in (1, 2, 3, 4):
        clock.advance(60)
        store.run(Put(0, batch(*[message() for _ in range(n)])))
    assert store.enqueue_counts() == {(0, "report", "acme"): [2.0, 3.0, 4.0]}


def test_one_receive_steps_over_at_most_max_scan_rows_expired_messages(make_store, clock):
    store = make_store(StoreConfig(max_scan_rows=100))
    for _ in range(3):
        store.run(Put(0, batch(*[message("old", ttl_s=1) for _ in range(110)])))
    clock.advance(1)
    store.run(Put(0, batch(message("fresh"))))
    delivered, receives = [], 0
    while not delivered:
        before = store.stats().rows_scanned
        delivered = received(store, 0, 1, 30)
        assert store.stats().rows_scanned - before <= 100 + 1
        receives += 1
    assert values(delivered) == ["fresh"] and receives == 4
    assert store.stats().expired == 330 and store.count(0) == 1
