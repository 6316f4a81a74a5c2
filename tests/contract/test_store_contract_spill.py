"""Spill store, sweeping and moving a flooder's messages, checked against every store."""

import dataclasses

import pytest

from rayq.config import StoreConfig
from rayq.core.codec.model import Ending
from rayq.errors import InvalidMessage
from rayq.core.storage.writes import Delete, MoveMatching, Put, Sweep
from tests.contract.helpers import batch, everything, message, received, values

DEDICATED = 7


def test_a_flooders_new_messages_are_spilled_counted_and_not_delivered(store):
    store.set_diverts({0: [("report", "acme")]})
    ids = store.run(Put(0, batch(message(1, tenant="acme"), message(2, tenant="other"),
                                 message(3, tenant="acme", type="email"))))
    assert len(set(ids)) == 3
    assert values(everything(store, 0)) == [2, 3]  # only the flooder's message is held back
    assert store.count(0) == 3  # spilled messages still count for their queue
    assert store.tenant_counts()[("S", 0, "report", "acme")] == 1
    assert store.stats().spilled == 1 and store.stats().cache.entries <= 2


def test_sweeping_moves_spilled_messages_back_keeping_ids_in_batches(store):
    store.set_diverts({0: [("report", "*")]})  # a type-level flooder: every tenant
    ids = store.run(Put(0, batch(*[message(i, tenant=f"t{i % 2}") for i in range(5)])))
    store.set_diverts({})
    assert store.run(Sweep("report", "*", DEDICATED, limit=3)) == 3
    assert store.run(Sweep("report", "*", DEDICATED, limit=3)) == 2
    assert store.run(Sweep("report", "*", DEDICATED, limit=3)) == 0
    got = everything(store, DEDICATED)
    assert sorted(m.id for m in got) == sorted(ids) and sorted(values(got)) == list(range(5))
    assert store.count(0) == 0 and store.count(DEDICATED) == 5
    assert not any(kind == "S" for kind, *_ in store.tenant_counts())


def test_a_spilled_task_that_expired_is_dropped_by_the_sweep_with_its_outcome(store, clock):
    store.set_diverts({0: [("report", "acme")]})
    task = dataclasses.replace(message(tenant="acme", ttl_s=5), task=True)
    [mid] = store.run(Put(0, batch(task)))
    clock.advance(6)
    assert store.run(Sweep("report", "acme", DEDICATED, 100)) == 0
    assert store.outcome(mid) == (Ending.EXPIRED, b"") and store.count(0) == 0


def test_move_matching_moves_visible_messages_of_the_flooder_only(store):
    store.run(Put(0, batch(*[message(i, tenant="acme" if i % 2 else "other") for i in range(10)])))
    [held] = received(store, 0, 1, 60)  # in flight: its receiver keeps it where it is
    moved, cursor, total = 0, None, 0
    while True:
        moved, cursor = store.run(MoveMatching(0, DEDICATED, "report", "acme", 3, cursor))
        total += moved
        if cursor is None:
            break
    assert total == 5 - (held.tenant == "acme")
    assert {m.tenant for m in everything(store, DEDICATED)} == {"acme"}
    assert store.run(Delete([held.receipt])) == []
    assert store.tenant_counts().get(("L", DEDICATED, "report", "acme")) == total


def test_tenant_counts_follow_puts_deletes_and_dead_letters(make_store, clock):
    store = make_store(StoreConfig())
    store.run(Put(0, batch(message(tenant="acme"), message(tenant="acme"), message(tenant="b"))))
    [first, *_] = received(store, 0, 3, 1, max_receives=1, dead_letter=9)
    store.run(Delete([first.receipt]))
    clock.advance(2)
    received(store, 0, 3, 1, max_receives=1, dead_letter=9)
    counts = store.tenant_counts()
    assert sum(n for (kind, sq, *_), n in counts.items() if sq == 9) == 2
    assert not any(sq == 0 for (_, sq, *_) in counts)


@pytest.mark.parametrize("call", [
    lambda s: s.set_diverts({0: [("", "acme")]}),
    lambda s: s.set_diverts([0]),
    lambda s: s.run(Sweep("report", "acme", -1, 10)),
    lambda s: s.run(Sweep("report", "acme", 1, 0)),
    lambda s: s.run(MoveMatching(0, 1, "report", "", 10)),
])
def test_bad_flood_calls_are_refused_and_change_nothing(store, call):
    store.run(Put(0, batch(message())))
    with pytest.raises(InvalidMessage):
        call(store)
    assert store.count(0) == 1 and store.diverts == {}
