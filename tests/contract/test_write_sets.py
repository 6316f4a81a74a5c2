"""Write sets: every committed write transaction, replayed on an empty second store,
leaves both stores reading the same, table by table (what replication ships)."""

import contextlib
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from rayq.config import StoreConfig
from rayq.core.codec.model import encode_body
from rayq.core.kit.kv import DATABASES, LmdbKV, Rewrite, Write, apply_writes
from rayq.core.storage import layout
from rayq.core.storage.layout import TABLES
from rayq.errors import StoreError
from rayq.core.storage.store import ShardStore
from rayq.testing import MemoryKV, plenty_of_memory
from rayq.core.storage.writes import (ChangeVisibility, CollectExpired, Defer, Delete, Finish, Put,
                                      Sweep)
from tests.contract.helpers import batch, message, received

CONFIG = StoreConfig(blob_threshold_bytes=64, blob_chunk_bytes=32)


@pytest.fixture(params=["lmdb", "memory"])
def make_kv(request, tmp_path):
    opened = []

    def make(on_commit=None):
        if request.param == "lmdb":
            kv = LmdbKV(tmp_path / f"kv{len(opened)}", on_commit=on_commit)
        else:
            kv = MemoryKV(on_commit=on_commit)
        opened.append(kv)
        return kv

    yield make
    for kv in opened:
        kv.close()


def everything(kv) -> dict[str, list[tuple[bytes, bytes]]]:
    return kv.read(lambda txn: {table: [(bytes(k), bytes(v)) for k, v in txn.scan(table, b"")]
                                for table in DATABASES})


def run_a_day(store: ShardStore, clock) -> None:
    """Puts (inline, blob, task, delayed), receives, deletes, visibility changes, a
    dead letter, a group with a failing call, a spill and sweep, a purge, expiry."""
    ids = store.run(Put(0, batch(*[message(i, key=f"k{i % 3}") for i in range(6)])))
    store.run(Put(0, batch(message(b"x" * 200, key="big"))))
    store.run(Put(0, batch(dataclasses.replace(message(b"task"), task=True))))
    store.run(Put(1, batch(message(b"later", delay_s=30), message(b"short", ttl_s=5))))
    got = received(store, 0, 4, 60)
    store.run(Delete([got[0].receipt]))
    store.run(ChangeVisibility(got[1].receipt, 0))
    store.run(Defer(got[2].receipt, 10))
    tasks = [m for m in received(store, 0, 10, 60) if m.body == encode_body(b"task", 1 << 30)]
    for m in tasks:
        store.run(Finish(m.receipt, b"done"))
    results = store.group([Delete(["not a receipt"]), Put(2, b"junk"),
                           Put(2, batch(message(b"grouped")))])
    assert isinstance(results[1], Exception) and len(results[2]) == 1
    received(store, 0, 2, 0, max_receives=1, dead_letter=3)
    store.set_diverts({4: [("report", "*")]})
    store.run(Put(4, batch(*[message(i, tenant=f"t{i}") for i in range(3)])))
    store.set_diverts({})
    store.run(Sweep("report", "*", 5, limit=2))
    store.set_state(6, store.state(6))
    store.purge([5])
    while store.purging:
        store.purge_some(limit=1)
    clock.advance(3600 * 24 * 30)
    store.run(CollectExpired(limit=100_000))
    assert ids


def test_replaying_each_write_set_on_an_empty_store_gives_the_same_tables(make_kv, clock):
    replica_kv = make_kv()
    seen = []

    def ship(writes):  # compared after every transaction
        replica_kv.apply(writes)
        seen.append(everything(replica_kv) == everything(source_kv))

    source_kv = make_kv(on_commit=ship)
    store = ShardStore(source_kv, config=CONFIG, clock=clock, memory_probe=plenty_of_memory)
    for _ in range(2):
        run_a_day(store, clock)
    assert len(seen) > 30 and all(seen), [i for i, same in enumerate(seen) if not same]
    replica = ShardStore(replica_kv, config=CONFIG, clock=clock, memory_probe=plenty_of_memory)
    assert replica.counts() == store.counts()
    assert replica.tenant_counts() == store.tenant_counts()
    assert replica.seq == store.seq and replica.store_id == store.store_id


def test_a_write_set_lists_puts_and_deletes_in_order_and_nothing_of_a_rolled_back_call(
        make_kv, clock):
    write_sets = []
    store = ShardStore(make_kv(on_commit=write_sets.append), clock=clock,
                       memory_probe=plenty_of_memory)
    write_sets.clear()  # opening wrote the store id
    [mid] = store.run(Put(0, batch(message(b"one"))))
    [put] = write_sets
    assert all(isinstance(w, Write) for w in put)
    assert [w.table for w in put if w.table in ("rows", "expiry")] == ["rows", "expiry"]
    assert all(w.value is not None for w in put)
    [got] = received(store, 0, 1, 60)
    assert store.run(Delete([got.receipt])) == []
    delete = write_sets[-1]
    assert ("rows", None) in [(w.table, w.value) for w in delete]
    before = len(write_sets)
    [error] = store.group([Put(0, b"not a put buffer")])
    assert isinstance(error, Exception)
    assert all(w.table not in ("rows", "expiry") for ws in write_sets[before:] for w in ws)


def test_a_receive_ships_each_row_it_hides_as_keys_and_a_header_not_its_body_again(
        make_kv, clock):
    write_sets = []
    store = ShardStore(make_kv(on_commit=write_sets.append), config=CONFIG, clock=clock,
                       memory_probe=plenty_of_memory)
    store.run(Put(0, batch(*[message(b"b" * 40 + bytes([i])) for i in range(3)])))
    replica_kv = make_kv()
    for writes in write_sets:
        replica_kv.apply(writes)
    got = received(store, 0, 3, 60)
    store.run(ChangeVisibility(got[0].receipt, 5))
    receive, change = write_sets[-2:]
    for writes in (receive, change):
        rows = [w for w in writes if w.table == "rows"]
        assert rows and all(isinstance(w, Rewrite) and len(w.value) == layout.REDELIVERED_AT
                            and w.source != w.key for w in rows)
        assert not any(b"b" * 40 in (w.value or b"") for w in writes)
    assert len(receive) and len([w for w in receive if w.table == "rows"]) == 3
    with pytest.raises(StoreError):  # a copy without the rows cannot replay their moves
        make_kv().apply(receive)
    replica_kv.apply(receive)
    replica_kv.apply(change)
    assert everything(replica_kv) == everything(store.kv)


def test_a_kv_without_a_watcher_records_nothing_and_a_read_writes_no_set(make_kv, clock):
    write_sets = []
    kv = make_kv()
    store = ShardStore(kv, clock=clock, memory_probe=plenty_of_memory)
    store.run(Put(0, batch(message(b"unseen"))))
    kv.watch(write_sets.append)
    store.peek(0)
    received(store, 1, 1, 0)  # nothing to receive: nothing written
    assert write_sets == []
    store.run(Put(0, batch(message(b"seen"))))
    assert len(write_sets) == 1


def test_the_layout_documents_every_table_the_kv_opens():
    assert sorted(TABLES) == sorted(DATABASES)


def test_a_nested_transaction_lands_in_the_write_set_only_when_it_commits(make_kv):
    write_sets = []
    kv = make_kv(on_commit=write_sets.append)

    def body(txn):
        txn.put("meta", b"a", b"1")
        with contextlib.suppress(ValueError), txn.nested() as child:
            child.put("meta", b"b", b"2")
            raise ValueError("undone")
        with txn.nested() as child:
            child.putmulti("meta", [(b"c", b"3")])
            child.delete("meta", b"a")
        txn.delete("meta", b"missing")  # deletes nothing: not a mutation
    kv.transact(body)
    assert write_sets == [(Write("meta", b"a", b"1"), Write("meta", b"c", b"3"),
                           Write("meta", b"a", None))]
    with pytest.raises(RuntimeError):
        kv.transact(lambda txn: (txn.put("meta", b"d", b"4"), _fail()))
    assert len(write_sets) == 1  # an aborted transaction ships nothing


def _fail():
    raise RuntimeError("abort")


# -- replaying: gathered runs against one write at a time ---------------------------------
def replay_one_by_one(txn, writes) -> None:
    """The replay apply_writes must match: each write as it comes."""
    for write in writes:
        if len(write) == 3:
            if write.value is None:
                txn.delete(write.table, write.key)
            else:
                txn.put(write.table, write.key, write.value)
            continue
        old = txn.get(write.table, write.source)
        value = None if old is None else write.value + old[len(write.value):]
        if value is None or len(value) != write.size:
            raise StoreError("this copy does not hold what the writer held")
        if write.source != write.key:
            txn.delete(write.table, write.source)
        txn.put(write.table, write.key, value)


_KEYS = st.sampled_from([b"a", b"b", b"c", b"d"])
_TABLES = st.sampled_from(["rows", "expiry"])
_WRITES = st.lists(st.one_of(
    st.builds(Write, _TABLES, _KEYS, st.one_of(st.none(), st.binary(min_size=1, max_size=6))),
    st.builds(lambda table, key, source, head: Rewrite(table, key, head, source, 8),
              _TABLES, _KEYS, _KEYS, st.binary(min_size=1, max_size=3))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(writes=_WRITES)
def test_a_replay_gathers_runs_of_puts_yet_ends_as_one_write_at_a_time(tmp_path_factory, writes):
    seeded = [Write(table, key, b"12345678") for table in ("rows", "expiry")
              for key in (b"a", b"b", b"c")]
    ends = []
    for replay in (apply_writes, replay_one_by_one):
        kv = LmdbKV(tmp_path_factory.mktemp("replay"))
        kv.apply(seeded)
        try:
            kv.transact(lambda txn: replay(txn, writes))
            ends.append(everything(kv))
        except StoreError:
            ends.append("refused")  # the whole write set, as a copy that misses a row
        finally:
            kv.close()
    assert ends[0] == ends[1]
