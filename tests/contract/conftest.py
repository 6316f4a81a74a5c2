"""One store fixture, parametrized over every store: the same rules must hold for each."""

import pytest

from rayq.config import StoreConfig
from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.kit.kv import LmdbKV
from rayq.core.storage.store import ShardStore
from rayq.testing import FakeClock, memory_store, plenty_of_memory


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=["lmdb", "memory"])
def make_store(request, tmp_path, clock):
    """A factory: make_store(config=..., memory_probe=..., dispatch=...) -> a fresh store
    on ``clock``."""
    opened = []

    def make(config=StoreConfig(), memory_probe=plenty_of_memory, dispatch=DispatchPolicy()):
        if request.param == "lmdb":
            kv = LmdbKV(tmp_path / f"shard{len(opened)}")
            store = ShardStore(kv, config=config, clock=clock, memory_probe=memory_probe,
                               dispatch=dispatch)
        else:
            store = memory_store(config, clock, memory_probe, dispatch)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store):
    return make_store()
