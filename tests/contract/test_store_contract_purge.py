"""Clearing and deleting take every message with them, spilled ones too, and the
removal runs in bounded background transactions (docs/visibility-and-receipts.md), checked
against every store."""

import dataclasses

import pytest

from rayq.core.codec.model import Ending
from rayq.errors import QueueDisabled
from rayq.core.storage.writes import Clear, MoveMatching, Put, Sweep
from tests.contract.helpers import batch, everything, message, received

DEDICATED = 7


def flooded(store, n_live=30, n_spilled=20):
    """Subqueue 0 with live messages (some in flight) and a flooder's spilled ones."""
    ids = store.run(Put(0, batch(*[message(i, tenant="calm") for i in range(n_live)])))
    received(store, 0, 5, 60)  # in flight
    store.set_diverts({0: [("report", "acme")]})
    ids += store.run(Put(0, batch(*[message(i, tenant="acme") for i in range(n_spilled)])))
    return ids


def test_clear_takes_the_spilled_messages_of_its_subqueue_with_it(store):
    flooded(store)
    store.run(Put(1, batch(message(tenant="acme"))))  # another subqueue's spill stays
    store.set_diverts({0: [("report", "acme")], 1: [("report", "acme")]})
    store.run(Put(1, batch(message(tenant="acme"))))
    assert store.run(Clear(0)) == 50
    assert store.count(0) == 0 and store.count(1) == 2
    assert store.run(Sweep("report", "acme", DEDICATED, 100)) == 1  # only subqueue 1's came back
    assert store.count(DEDICATED) == 1


def test_a_purged_subqueue_counts_and_delivers_nothing_at_once(store):
    flooded(store)
    store.purge([0])
    assert store.count(0) == 0 and store.peek(0, 10) == []
    with pytest.raises(QueueDisabled):
        received(store, 0, 10, 30)
    with pytest.raises(QueueDisabled):
        store.run(Put(0, batch(message())))
    assert store.run(Sweep("report", "acme", DEDICATED, 100)) == 0  # spilled: never comes back
    assert store.count(DEDICATED) == 0
    assert not any(kind == "S" for kind, *_ in store.tenant_counts())


def test_the_background_removal_is_bounded_per_transaction_and_ends(store):
    flooded(store, n_live=35, n_spilled=12)
    store.run(Put(1, batch(*[message(i) for i in range(3)])))  # a neighbour: untouched
    store.purge([0])
    steps = []
    while store.purging:
        steps.append(store.purge_some(limit=10))
        assert len(steps) < 50
    assert max(steps) <= 20 and sum(steps) == 47  # 10 rows + 10 spill entries at most
    assert store.stats().messages == 3 and store.count(1) == 3
    assert set(store.tenant_counts()) == {("L", 1, "report", "acme")}
    assert store.purge_some(limit=10) == 0


def test_tasks_removed_by_a_purge_end_as_deleted(store):
    [live] = store.run(Put(0, batch(dataclasses.replace(message(), task=True))))
    store.set_diverts({0: [("report", "acme")]})
    [spilled] = store.run(Put(0, batch(dataclasses.replace(message(tenant="acme"), task=True))))
    store.purge([0])
    while store.purging:
        store.purge_some()
    assert store.outcome(live) == (Ending.DELETED, b"")
    assert store.outcome(spilled) == (Ending.DELETED, b"")


def test_nothing_moves_into_a_subqueue_being_removed(store):
    store.set_diverts({0: [("report", "acme")]})
    store.run(Put(0, batch(message(tenant="acme"))))
    store.run(Put(1, batch(message(tenant="acme"))))
    store.purge([DEDICATED])
    with pytest.raises(QueueDisabled):
        store.run(Sweep("report", "acme", DEDICATED, 100))
    with pytest.raises(QueueDisabled):
        store.run(MoveMatching(1, DEDICATED, "report", "acme", 100))
    assert store.count(0) == 1 and store.count(1) == 1  # nothing was lost either
    assert len(everything(store, 1)) == 1


def test_nothing_moves_out_of_a_subqueue_being_removed(store):
    store.run(Put(0, batch(*[message(tenant="acme") for _ in range(3)])))
    store.purge([0])
    assert store.run(MoveMatching(0, DEDICATED, "report", "acme", 100)) == (0, None)
    assert store.count(DEDICATED) == 0
