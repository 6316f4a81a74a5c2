"""Ordered subqueues (a FIFO queue's): each fairness key is a message group that
delivers one batch at a time and in seq order, checked against every store."""

from rayq.core.auth.accounts import check_senders
from rayq.core.kit.kv import LmdbKV
from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.storage.store import ShardStore
from rayq.errors import AuthError
from rayq.core.codec.wire import decode_delivered
from tests.contract.helpers import batch, message, values


def _ordered(store, sq=0):
    store.set_ordered(sq)
    return store


def test_a_groups_next_message_waits_while_its_first_is_in_flight(store, clock):
    _ordered(store).put(0, [message("a1", key="a"), message("a2", key="a")])
    [first] = store.receive(0, 1, 30)
    assert values([first]) == ["a1"]
    assert store.receive(0, 10, 30) == []
    assert store.peek(0, 10) == []
    store.delete([first.receipt])
    assert values(store.receive(0, 10, 30)) == ["a2"]


def test_a_message_whose_visibility_lapses_comes_back_before_the_groups_later_ones(store, clock):
    _ordered(store).put(0, [message("a1", key="a")])
    clock.advance(1)
    store.put(0, [message("a2", key="a")])
    [first] = store.receive(0, 1, 5)
    clock.advance(5)
    store.put(0, [message("a3", key="a")])
    again = store.receive(0, 10, 5)
    assert values(again) == ["a1", "a2", "a3"]
    assert again[0].dequeue_count == 2 and again[0].id == first.id


def test_other_groups_are_served_while_one_is_held(store, clock):
    _ordered(store).put(0, [message("a1", key="a"), message("a2", key="a"),
                            message("b1", key="b"), message("b2", key="b")])
    [a1] = store.receive(0, 1, 30, keys=["a"])
    assert values(store.receive(0, 10, 30)) == ["b1", "b2"]
    assert store.receive(0, 10, 30) == []
    store.delete([a1.receipt])
    assert values(store.receive(0, 10, 30)) == ["a2"]


def test_a_changed_visibility_holds_the_group_until_it_lapses(store, clock):
    _ordered(store).put(0, [message("a1", key="a"), message("a2", key="a")])
    [first] = store.receive(0, 1, 30)
    receipt = store.change_visibility(first.receipt, 0)
    assert values(store.receive(0, 1, 30)) == ["a1"]
    assert receipt != first.receipt


def test_a_group_is_released_when_all_its_in_flight_messages_are_deleted(store, clock):
    _ordered(store).put(0, [message(i, key="a") for i in range(3)])
    got = store.receive(0, 2, 30)
    assert values(got) == [0, 1]
    store.delete([got[0].receipt])
    assert store.receive(0, 10, 30) == []
    store.delete([got[1].receipt])
    assert values(store.receive(0, 10, 30)) == [2]


def test_in_flight_counts_of_an_ordered_subqueue(store, clock):
    _ordered(store).put(0, [message(i, key="a") for i in range(3)])
    store.receive(0, 1, 30)
    assert store.visibility_counts(0) == (2, 1, 0)
    clock.advance(31)
    assert store.visibility_counts(0) == (3, 0, 0)


def test_ordered_groups_are_served_fairly(make_store, clock):
    store = _ordered(make_store(dispatch=DispatchPolicy()))
    store.put(0, [message(f"a{i}", key="a") for i in range(5)])
    store.put(0, [message("b0", key="b")])
    got = store.receive(0, 1, 30)
    assert values(got) == ["a0"]
    assert values(store.receive(0, 1, 30)) == ["b0"]  # a is held; b is served


def test_the_order_survives_a_reopen(tmp_path, clock):
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock)
    store.set_ordered(0)
    store.put(0, [message("a1", key="a"), message("a2", key="a")])
    store.receive(0, 1, 30)
    store.close()
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock)
    try:
        assert store.ordered(0) and store.receive(0, 10, 30) == []
        clock.advance(31)
        assert values(store.receive(0, 10, 30)) == ["a1", "a2"]
    finally:
        store.close()


def test_unordered_subqueues_keep_redelivering_behind_later_messages(store, clock):
    store.set_ordered(1)
    store.put(0, [message("a1", key="a"), message("a2", key="a")])
    [first] = store.receive(0, 1, 5)
    assert values(store.receive(0, 10, 5)) == ["a2"]
    clock.advance(3)
    store.put(0, [message("a3", key="a")])
    clock.advance(2)
    assert values(store.receive(0, 10, 5)) == ["a3", "a1", "a2"]
    assert not store.ordered(0) and store.ordered(1)


def test_a_sender_chooses_its_key_only_on_an_ordered_subqueue(tmp_path, clock):
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock, check_senders=check_senders)
    try:
        store.set_ordered(1)
        grouped = batch(message("g", tenant="acme", key="group-1"))
        sender = {"sender": ("acme", "type", None)}
        refused, ids = store.group([("put", (0, grouped), sender), ("put", (1, grouped), sender)])
        assert isinstance(refused, AuthError) and len(ids) == 1
        assert (store.count(0), store.count(1)) == (0, 1)
    finally:
        store.close()


def test_a_long_poll_on_a_held_group_wakes_when_its_hold_ends(store, clock):
    _ordered(store).put(0, [message("a1", key="a"), message("a2", key="a")])
    store.receive(0, 1, 5)
    assert store.dispatch.next_due([0]) == clock.now() + 5
    store.put(0, [message("b1", key="b")])
    assert values(store.receive(0, 10, 5)) == ["b1"]


def test_a_held_group_shows_no_waiting_latency(store, clock):
    _ordered(store).put(0, [message("a1", key="a"), message("a2", key="a")])
    store.receive(0, 1, 30)
    clock.advance(10)
    [depth] = store.depths()
    assert (depth.key, depth.count, depth.latency_s) == ("a", 2, 0.0)
    clock.advance(21)
    [depth] = store.depths()
    assert depth.latency_s > 0


def test_a_held_group_gives_nothing_to_a_listen_order_or_a_second_receive_of_one_commit(store):
    _ordered(store).put(0, [message("a1", key="a"), message("a2", key="a")])
    [first] = store.receive(0, 1, 30, keys=["a"])
    assert store.receive(0, 10, 30, keys=["a"]) == []
    store.delete([first.receipt])
    one, two = store.group([("receive", (0, 1, 30), {}), ("receive", (0, 1, 30), {})])
    assert len(decode_delivered(one)) == 1 and decode_delivered(two) == []


def test_an_account_keys_its_own_plain_subqueue_by_group_when_the_shard_says_it_owns_it(
        tmp_path, clock):
    store = ShardStore(LmdbKV(tmp_path / "s"), clock=clock, check_senders=check_senders)
    try:
        grouped = batch(message("g", tenant="acme", key="group-1"))
        owner = {"sender": ("acme", "type", None, True)}
        other = {"sender": ("acme", "type", {"default"}, False)}  # another owner's task queue
        refused, ids = store.group([("put", (0, grouped), other), ("put", (0, grouped), owner)])
        assert isinstance(refused, AuthError) and len(ids) == 1
        [got] = store.receive(0, 1, 30)
        assert (got.tenant, got.key) == ("acme", "group-1")  # the tenant stays the account
    finally:
        store.close()
