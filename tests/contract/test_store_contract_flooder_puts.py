"""A listed flooder's new messages spilled, throttled or blocked (FloodConfig.flooder_puts),
checked against every store on a fake clock: a refused put stores nothing, and nothing
stored before is lost."""

import pytest

from rayq.core.storage.spill import FlooderPuts
from rayq.core.storage.writes import Put, Sweep
from rayq.errors import Throttled
from tests.contract.helpers import batch, everything, message, values

DEDICATED = 7


def listed(store, policy):
    store.set_flooder_puts(policy)
    before = store.run(Put(0, batch(message(0, tenant="acme"), message(1, tenant="calm"))))
    store.set_diverts({0: [("report", "acme")]})
    return before


def test_a_blocked_flooders_puts_are_refused_whole_while_listed_and_others_go_on(store):
    before = listed(store, FlooderPuts("block"))
    with pytest.raises(Throttled, match="listed as a flooder"):
        store.run(Put(0, batch(message(2, tenant="calm"), message(3, tenant="acme"))))
    assert store.run(Put(0, batch(message(4, tenant="calm"), message(5, tenant="acme", type="email"))))
    got = everything(store, 0)
    assert sorted(values(got)) == [0, 1, 4, 5]  # the refused put: nothing of it
    assert {m.id for m in got} >= set(before)  # stored before: kept
    assert store.stats().spilled == 0
    store.set_diverts({})  # no longer listed: its puts go through again
    assert store.run(Put(0, batch(message(6, tenant="acme"))))
    assert store.count(0) == 5


def test_a_throttled_flooder_is_spilled_up_to_its_rate_then_refused_until_it_refills(store, clock):
    listed(store, FlooderPuts("throttle", rate_per_s=2.0, burst=3))
    assert len(store.run(Put(0, batch(*[message(i, tenant="acme") for i in range(2)])))) == 2
    assert len(store.run(Put(0, batch(*[message(i, tenant="acme") for i in range(4)])))) == 4  # 1 left: in
    with pytest.raises(Throttled, match="2 messages/s"):  # 3 in debt
        store.run(Put(0, batch(message(9, tenant="acme"))))
    assert store.run(Put(0, batch(message(9, tenant="calm"))))  # another tenant: never throttled
    clock.advance(1.0)  # 2 back: still in debt by 1
    with pytest.raises(Throttled):
        store.run(Put(0, batch(message(9, tenant="acme"))))
    clock.advance(1.0)
    assert store.run(Put(0, batch(message(9, tenant="acme"))))
    assert store.stats().spilled == 7  # the admitted ones went to the spill store, as before
    assert store.run(Sweep("report", "acme", DEDICATED, limit=100)) == 7
    assert store.count(DEDICATED) == 7


def test_spill_lets_every_flooders_put_through_as_before(store):
    listed(store, FlooderPuts())
    for _ in range(5):
        store.run(Put(0, batch(*[message(i, tenant="acme") for i in range(500)])))
    assert store.stats().spilled == 2500
