"""Ordered subqueues (a FIFO queue's): each fairness key is a message group that
delivers one batch at a time and in seq order, checked against every store."""

from rayq.core.auth.accounts import check_senders
from rayq.core.kit.kv import LmdbKV
from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.storage.store import ShardStore
from rayq.errors import AuthError
from rayq.core.codec.wire import decode_delivered
from rayq.core.storage.writes import ChangeVisibility, Delete, Put, Receive
from tests.contract.helpers import batch, message, received, values


def _ordered(store, sq=0):
    store.set_ordered(sq)
    return store


def test_a_groups_next_message_waits_while_its_first_is_in_flight(store, clock):
    _ordered(store).run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    [first] = received(store, 0, 1, 30)
    assert values([first]) == ["a1"]
    assert received(store, 0, 10, 30) == []
    assert store.peek(0, 10) == []
    store.run(Delete([first.receipt]))
    assert values(received(store, 0, 10, 30)) == ["a2"]


def test_a_message_whose_visibility_lapses_comes_back_before_the_groups_later_ones(store, clock):
    _ordered(store).run(Put(0, batch(message("a1", key="a"))))
    clock.advance(1)
    store.run(Put(0, batch(message("a2", key="a"))))
    [first] = received(store, 0, 1, 5)
    clock.advance(5)
    store.run(Put(0, batch(message("a3", key="a"))))
    again = received(store, 0, 10, 5)
    assert values(again) == ["a1", "a2", "a3"]
    assert again[0].dequeue_count == 2 and again[0].id == first.id


def test_other_groups_are_served_while_one_is_held(store, clock):
    _ordered(store).run(Put(0, batch(message("a1", key="a"), message("a2", key="a"),
                                     message("b1", key="b"), message("b2", key="b"))))
    [a1] = received(store, 0, 1, 30, keys=["a"])
    assert values(received(store, 0, 10, 30)) == ["b1", "b2"]
    assert received(store, 0, 10, 30) == []
    store.run(Delete([a1.receipt]))
    assert values(received(store, 0, 10, 30)) == ["a2"]


def test_a_changed_visibility_holds_the_group_until_it_lapses(store, clock):
    _ordered(store).run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    [first] = received(store, 0, 1, 30)
    receipt = store.run(ChangeVisibility(first.receipt, 0))
    assert values(received(store, 0, 1, 30)) == ["a1"]
    assert receipt != first.receipt


def test_a_group_is_released_when_all_its_in_flight_messages_are_deleted(store, clock):
    _ordered(store).run(Put(0, batch(*[message(i, key="a") for i in range(3)])))
    got = received(store, 0, 2, 30)
    assert values(got) == [0, 1]
    store.run(Delete([got[0].receipt]))
    assert received(store, 0, 10, 30) == []
    store.run(Delete([got[1].receipt]))
    assert values(received(store, 0, 10, 30)) == [2]


def test_in_flight_counts_of_an_ordered_subqueue(store, clock):
    _ordered(store).run(Put(0, batch(*[message(i, key="a") for i in range(3)])))
    received(store, 0, 1, 30)
    assert store.visibility_counts(0) == (2, 1, 0)
    clock.advance(31)
    assert store.visibility_counts(0) == (3, 0, 0)


def test_ordered_groups_are_served_fairly(make_store, clock):
    store = _ordered(make_store(dispatch=DispatchPolicy()))
    store.run(Put(0, batch(*[message(f"a{i}", key="a") for i in range(5)])))
    store.run(Put(0, batch(message("b0", key="b"))))
    got = received(store, 0, 1, 30)
    assert values(got) == ["a0"]
    assert values(received(store, 0, 1, 30)) == ["b0"]  # a is held; b is served


def test_the_order_survives_a_reopen(tmp_path, clock):
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock)
    store.set_ordered(0)
    store.run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    received(store, 0, 1, 30)
    store.close()
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock)
    try:
        assert store.ordered(0) and received(store, 0, 10, 30) == []
        clock.advance(31)
        assert values(received(store, 0, 10, 30)) == ["a1", "a2"]
    finally:
        store.close()


def test_unordered_subqueues_keep_redelivering_behind_later_messages(store, clock):
    store.set_ordered(1)
    store.run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    [first] = received(store, 0, 1, 5)
    assert values(received(store, 0, 10, 5)) == ["a2"]
    clock.advance(3)
    store.run(Put(0, batch(message("a3", key="a"))))
    clock.advance(2)
    assert values(received(store, 0, 10, 5)) == ["a3", "a1", "a2"]
    assert not store.ordered(0) and store.ordered(1)


def test_a_sender_chooses_its_key_only_on_an_ordered_subqueue(tmp_path, clock):
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock, check_senders=check_senders)
    try:
        store.set_ordered(1)
        grouped = batch(message("g", tenant="acme", key="group-1"))
        sender = ("acme", "type", None)
        refused, ids = store.group([Put(0, grouped, sender), Put(1, grouped, sender)])
        assert isinstance(refused, AuthError) and len(ids) == 1
        assert (store.count(0), store.count(1)) == (0, 1)
    finally:
        store.close()


def test_a_long_poll_on_a_held_group_wakes_when_its_hold_ends(store, clock):
    _ordered(store).run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    received(store, 0, 1, 5)
    assert store.dispatch.next_due([0]) == clock.now() + 5
    store.run(Put(0, batch(message("b1", key="b"))))
    assert values(received(store, 0, 10, 5)) == ["b1"]


def test_a_held_group_shows_no_waiting_latency(store, clock):
    _ordered(store).run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    received(store, 0, 1, 30)
    clock.advance(10)
    [depth] = store.depths()
    assert (depth.key, depth.count, depth.latency_s) == ("a", 2, 0.0)
    clock.advance(21)
    [depth] = store.depths()
    assert depth.latency_s > 0


def test_a_held_group_gives_nothing_to_a_listen_order_or_a_second_receive_of_one_commit(store):
    _ordered(store).run(Put(0, batch(message("a1", key="a"), message("a2", key="a"))))
    [first] = received(store, 0, 1, 30, keys=["a"])
    assert received(store, 0, 10, 30, keys=["a"]) == []
    store.run(Delete([first.receipt]))
    one, two = store.group([Receive(0, 1, 30), Receive(0, 1, 30)])
    assert len(decode_delivered(one)) == 1 and decode_delivered(two) == []


def test_an_account_keys_its_own_plain_subqueue_by_group_when_the_shard_says_it_owns_it(
        tmp_path, clock):
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock, check_senders=check_senders)
    try:
        grouped = batch(message("g", tenant="acme", key="group-1"))
        owner = ("acme", "type", None, True)
        other = ("acme", "type", {"default"}, False)  # another owner's task queue
        refused, ids = store.group([Put(0, grouped, other), Put(0, grouped, owner)])
        assert isinstance(refused, AuthError) and len(ids) == 1
        [got] = received(store, 0, 1, 30)
        assert (got.tenant, got.key) == ("acme", "group-1")  # the tenant stays the account
    finally:
        store.close()


def test_a_message_put_and_received_in_one_group_counts_its_next_delivery_as_its_second(
        store, clock):
    """The put and the receive commit together and the row keeps its key: what the
    store keeps of it in memory is the received row, not the row as put."""
    _, delivered = _ordered(store).group([Put(0, batch(message("a1", key="a"))),
                                          Receive(0, 1, 5)])
    [first] = decode_delivered(delivered)
    assert first.dequeue_count == 1
    clock.advance(10)
    [again] = received(store, 0, 1, 5)
    assert (again.dequeue_count, again.receipt != first.receipt) == (2, True)
    assert store.run(Delete([first.receipt])) == [first.receipt]  # an old receipt is stale
