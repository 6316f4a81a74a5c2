"""Priorities: among one fairness key's visible messages, a higher priority is received
first; between keys, fair dispatch decides as before."""

import pytest

from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.storage.writes import ChangeVisibility, CollectExpired, Defer, Put
from rayq.errors import InvalidMessage
from tests.contract.helpers import batch, everything, received, values


def urgent(value, priority, *, key="k", delay_s=0.0) -> NewMessage:
    return NewMessage(encode_body(value, 1 << 30), "acme", "report", key, delay_s,
                      priority=priority)


def test_a_higher_priority_is_received_first_within_a_key(store):
    store.run(Put(0, batch(*[urgent(i, 0) for i in range(20)])))
    store.run(Put(0, batch(urgent("nine", 9))))
    store.run(Put(0, batch(urgent("three", 3))))
    store.run(Put(0, batch(urgent("nine again", 9))))
    assert values(everything(store)) == ["nine", "nine again", "three", *range(20)]


def test_a_delayed_urgent_message_takes_its_place_once_it_shows(store, clock):
    store.run(Put(0, batch(urgent("late", 9, delay_s=5))))
    store.run(Put(0, batch(*[urgent(i, 0) for i in range(3)])))
    assert values(received(store, 0, 1, 30)) == [0]
    clock.advance(5)
    assert values(everything(store)) == ["late", 1, 2]


def test_a_retried_urgent_message_comes_back_ahead_of_its_key(store, clock):
    store.run(Put(0, batch(urgent("urgent", 7))))
    store.run(Put(0, batch(*[urgent(i, 0) for i in range(3)])))
    [first] = received(store, 0, 1, 30)
    assert first.dequeue_count == 1 and values([first]) == ["urgent"]
    store.run(ChangeVisibility(first.receipt, 2))  # a retry after two seconds
    assert values(received(store, 0, 1, 30)) == [0]
    clock.advance(2)
    again = received(store, 0, 3, 30)
    assert values(again) == ["urgent", 1, 2] and again[0].dequeue_count == 2


def test_a_lapsed_urgent_message_keeps_its_receipt_until_received_again(store, clock):
    store.run(Put(0, batch(urgent("urgent", 5))))
    [first] = received(store, 0, 1, 10)
    clock.advance(11)
    store.run(Put(0, batch(urgent("other", 0, key="other"))))
    assert values(received(store, 0, 1, 30, keys=["other"])) == ["other"]  # moves it up
    new_receipt = store.run(ChangeVisibility(first.receipt, 30))  # still its holder's
    store.run(ChangeVisibility(new_receipt, 0))
    assert values(received(store, 0, 1, 30)) == ["urgent"]


def test_priorities_do_not_buy_a_key_more_than_its_fair_share(make_store):
    store = make_store(dispatch=DispatchPolicy())
    store.run(Put(0, batch(*[urgent(f"a{i}", 9, key="a") for i in range(10)])))
    store.run(Put(0, batch(*[urgent(f"b{i}", 0, key="b") for i in range(10)])))
    got = [m.key for m in received(store, 0, 10, 30)]
    assert got.count("a") == got.count("b") == 5


def test_fifo_dispatch_orders_keys_by_age_not_by_priority(make_store, clock):
    store = make_store(dispatch=DispatchPolicy(mode="fifo"))
    store.run(Put(0, batch(urgent("old", 0, key="b"))))
    clock.advance(1)
    store.run(Put(0, batch(urgent("new but urgent", 9, key="a"))))
    assert values(received(store, 0, 2, 30)) == ["old", "new but urgent"]


@pytest.mark.parametrize("priority", [-1, 10, 1.5, True, "9"])
def test_a_priority_outside_0_to_9_is_refused_and_nothing_is_stored(store, priority):
    with pytest.raises(InvalidMessage):
        store.run(Put(0, batch(urgent("x", 0), priority=priority)))
    assert everything(store) == []


def test_an_ordered_subqueue_refuses_a_priority_and_keeps_what_it_holds(store):
    store.set_ordered(0)
    store.run(Put(0, batch(urgent("first", 0))))
    with pytest.raises(InvalidMessage, match="ordered"):
        store.run(Put(0, batch(urgent("urgent", 4))))
    assert values(everything(store)) == ["first"]


def test_a_retried_task_goes_back_to_its_place_by_age_once_its_back_off_ends(store, clock):
    store.run(Put(0, batch(urgent("old", 0))))
    [old] = received(store, 0, 1, 30)
    clock.advance(1200)  # the old one ran long, then failed
    store.run(Put(0, batch(urgent("young", 0))))
    store.run(ChangeVisibility(old.receipt, 100, usage=b"report"))  # a retry in 100 s
    clock.advance(100)
    store.run(CollectExpired())  # the shard's periodic pass: no receive needed
    [depth] = store.depths()
    assert depth.oldest_age_s == 1300  # not the young one's 100
    assert values(everything(store)) == ["old", "young"]


def test_a_deferred_task_still_waits_behind_the_messages_that_showed_before_it(store, clock):
    store.run(Put(0, batch(urgent("held", 0))))
    [held] = received(store, 0, 1, 30)
    store.run(Put(0, batch(urgent("next", 0))))
    store.run(Defer(held.receipt, 1, usage=b"report"))  # its type at its limit
    clock.advance(1)
    assert values(everything(store)) == ["next", "held"]
