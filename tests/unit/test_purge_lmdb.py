"""A shard that stops in the middle of removing a cleared subqueue goes on after a
restart, and none of the cleared messages is ever delivered again."""

import pytest

from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.storage.store import ShardStore
from rayq.errors import QueueDisabled
from rayq.testing import FakeClock, plenty_of_memory
from rayq.core.storage.writes import Put, Sweep
from tests.contract.helpers import batch, received


def message(value, tenant="acme") -> NewMessage:
    return NewMessage(encode_body(value, 1 << 30), tenant, "report", "k")


def open_store(path, clock) -> ShardStore:
    return ShardStore(LmdbKV(path), clock=clock, memory_probe=plenty_of_memory)


def test_a_restart_mid_removal_resumes_it(tmp_path):
    clock = FakeClock()
    store = open_store(tmp_path, clock)
    store.run(Put(0, batch(*[message(i) for i in range(500)])))
    store.set_diverts({0: [("report", "acme")]})
    store.run(Put(0, batch(*[message(i) for i in range(40)])))
    store.set_diverts({})
    store.run(Put(1, batch(message("keep", tenant="other"))))
    store.purge([0])
    store.purge_some(limit=100)
    store.close()

    store = open_store(tmp_path, clock)  # as after a crash: only what was committed
    assert store.purging == {0} and store.count(0) == 0
    with pytest.raises(QueueDisabled):
        received(store, 0, 10, 30)
    steps = 0
    while store.purging:
        store.purge_some(limit=100)
        steps += 1
    assert steps <= 6  # 400 rows + 40 spilled, 100 a transaction, then the last unmark
    assert store.stats().messages == 1 and not store.run(Sweep("report", "acme", 2, 100))
    store.close()
    assert open_store(tmp_path, clock).purging == set()
