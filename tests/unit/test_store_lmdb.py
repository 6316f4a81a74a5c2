"""The LMDB store: durability across reopen and crashes, map growth, receive cost vs depth."""

import os
import signal
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from rayq.config import StoreConfig
from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.wire import encode_messages
from rayq.core.codec.model import NewMessage, decode_body, encode_body
from rayq.core.storage.store import ShardStore
from rayq.testing import FakeClock, plenty_of_memory
from rayq.core.storage.writes import CollectExpired, Defer, Delete, Put
from tests.contract.helpers import batch, received

REPO = Path(__file__).resolve().parents[2]


def message(value, key="k", **fields) -> NewMessage:
    return NewMessage(encode_body(value, 1 << 30), "acme", "report", key, **fields)


def open_store(path, clock, **kv_options) -> ShardStore:
    return ShardStore(LmdbKV(path, **kv_options), clock=clock,
                      config=StoreConfig(blob_threshold_bytes=1024, blob_chunk_bytes=300),
                      memory_probe=plenty_of_memory)


def drain(store, subqueue=0) -> list:
    out = []
    while batch := received(store, subqueue, 1000, 3600):
        out.extend(batch)
    return out


# -- reopen ---------------------------------------------------------------------
def test_every_message_count_and_hidden_state_survive_a_reopen(tmp_path):
    clock = FakeClock()
    store = open_store(tmp_path / "shard", clock)
    ids = store.run(Put(0, batch(message("a", key="x"), message(b"b" * 5000, key="y"),
                                 message("later", delay_s=100), message("mortal", ttl_s=50))))
    store.run(Put(7, batch(message({"n": 7}))))
    [hidden] = received(store, 0, 1, 60, keys=["x"])
    counts, depths = store.counts(), store.depths()
    store.close()

    store = open_store(tmp_path / "shard", clock)
    assert store.counts() == counts and store.depths() == depths
    assert [decode_body(m.body) for m in store.peek(0, 10)] == [b"b" * 5000, "mortal"]
    clock.advance(60)
    again = received(store, 0, 10, 30, keys=["x"])
    assert [(m.id, m.dequeue_count) for m in again] == [(hidden.id, 2)]
    assert store.run(Delete([hidden.receipt])) == [hidden.receipt]
    assert store.run(Delete([again[0].receipt])) == []
    clock.advance(40)
    assert {decode_body(m.body) for m in drain(store)} == {b"b" * 5000, "later"}
    assert [decode_body(m.body) for m in drain(store, 7)] == [{"n": 7}]
    assert not set(store.run(Put(0, batch(message("new"))))) & set(ids)
    store.close()


def test_holding_names_the_subqueues_with_messages_and_survives_a_reopen(tmp_path):
    clock = FakeClock()
    store = open_store(tmp_path / "shard", clock)
    for sq in (0, 3, 7):
        store.run(Put(sq, batch(message(sq))))
    [got] = received(store, 3, 1, 60)
    assert store.run(Delete([got.receipt])) == []  # none failed
    store.purge([7])
    assert store.holding() == {0}
    store.close()
    assert open_store(tmp_path / "shard", clock).holding() == {0}


def test_a_receipt_issued_before_a_reopen_is_still_valid_after_it(tmp_path):
    clock = FakeClock()
    store = open_store(tmp_path / "shard", clock)
    store.run(Put(0, batch(message("a"))))
    [got] = received(store, 0, 1, 30)
    store.close()
    store = open_store(tmp_path / "shard", clock)
    assert store.run(Delete([got.receipt])) == [] and store.counts() == {}
    store.close()


# -- map growth -------------------------------------------------------------------
def test_the_map_grows_instead_of_failing_when_it_is_full(tmp_path):
    store = open_store(tmp_path / "shard", FakeClock(), map_size=1 << 20)
    for i in range(40):
        store.run(Put(0, batch(*[message(bytes([i]) * 50_000, key=f"k{i % 3}") for _ in range(2)])))
    store.group([Put(1, encode_messages([message(b"g" * 30_000) for _ in range(40)]))])
    assert store.stats().map_size_bytes > 4 << 20
    assert store.count(0) == 80 and store.count(1) == 40
    assert sorted(m.body[1] for m in drain(store)) == sorted(list(range(40)) * 2)
    store.close()


# -- crash --------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys
    from rayq.core.kit.kv import LmdbKV
    from rayq.core.codec.model import NewMessage, encode_body
    from rayq.core.codec.wire import encode_messages
    from rayq.core.storage.store import ShardStore
    from rayq.core.storage.writes import Put
    from rayq.testing import FakeClock, plenty_of_memory

    store = ShardStore(LmdbKV(sys.argv[1]), clock=FakeClock(), memory_probe=plenty_of_memory)
    batch = 0
    while True:
        store.run(Put(0, encode_messages([
            NewMessage(encode_body(f"{batch}:{i}:" + "x" * 200, 1024), "t", "crash", "k")
            for i in range(50)])))
        print(batch, flush=True)  # only once the put returned: the batch is committed
        batch += 1
""")


def _run_child_until(path, batches: int) -> int:
    """Start a putting child, SIGKILL it after ``batches`` reports; the last batch reported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, cwd=REPO, text=True)
    reported = -1
    try:
        while reported < batches:
            line = child.stdout.readline()
            assert line, f"the child died by itself: {child.stderr.read()}"
            reported = int(line)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    tail = child.stdout.read().split("\n")
    complete = [int(n) for n in tail[:-1] if n]  # a line cut by the kill does not count
    child.stdout.close()
    child.stderr.close()
    return max([reported, *complete])


def test_a_killed_writer_leaves_every_reported_batch_whole_and_no_batch_half_applied(tmp_path):
    reported = _run_child_until(tmp_path / "shard", batches=300)
    store = open_store(tmp_path / "shard", FakeClock())
    by_batch = defaultdict(set)
    for m in drain(store):
        batch, i, _ = decode_body(m.body).split(":")
        by_batch[int(batch)].add(int(i))
    assert all(found == set(range(50)) for found in by_batch.values())
    assert sorted(by_batch) == list(range(len(by_batch)))
    assert reported + 1 <= len(by_batch) <= reported + 2
    assert store.count(0) == 50 * len(by_batch)
    store.close()


# -- receive cost does not grow with depth ----------------------------------------------
ROWS = 100_000


def _hidden(store, clock):
    for _ in range(ROWS // 1000):
        store.run(Put(0, batch(*[message("old") for _ in range(1000)])))
    while received(store, 0, 1000, 3600):
        pass


def _expired(store, clock):
    for _ in range(ROWS // 1000):
        store.run(Put(0, batch(*[message("old", ttl_s=5) for _ in range(1000)])))
    clock.advance(5)
    assert store.run(CollectExpired(ROWS)) == ROWS


def _deleted(store, clock):
    for _ in range(ROWS // 1000):
        store.run(Put(0, batch(*[message("old") for _ in range(1000)])))
        store.run(Delete([m.receipt for m in received(store, 0, 1000, 3600)]))


@pytest.mark.parametrize("rows_ahead", [_hidden, _expired, _deleted])
def test_one_receive_reads_a_constant_number_of_rows_whatever_lies_ahead(tmp_path, rows_ahead):
    clock = FakeClock()
    store = open_store(tmp_path / "shard", clock, durable=False)
    rows_ahead(store, clock)
    store.run(Put(0, batch(message("fresh"))))
    before = store.stats().rows_scanned
    assert [decode_body(m.body) for m in received(store, 0, 1, 30)] == ["fresh"]
    assert store.stats().rows_scanned - before <= 2
    store.close()


# -- a key's age: its oldest message's, since it was enqueued --------------------------
def age_of(store) -> float:
    [depth] = store.depths()
    return depth.oldest_age_s


def test_a_redelivered_message_keeps_its_age_from_its_enqueue(tmp_path):
    clock = FakeClock(1000.0)
    store = open_store(tmp_path / "db", clock)
    store.run(Put(0, batch(message("a"))))
    clock.advance(4)
    assert received(store, 0, 1, 1.0)  # hidden for 1 s, then visible again
    clock.advance(2)
    [depth] = store.depths()
    assert depth.oldest_age_s == pytest.approx(6.0)
    assert depth.latency_s == pytest.approx(1.0)  # visible again for 1 s


def test_a_deferred_message_keeps_its_age_from_its_enqueue(tmp_path):
    clock = FakeClock(1000.0)
    store = open_store(tmp_path / "db", clock)
    store.run(Put(0, batch(message("a"))))
    clock.advance(3)
    [got] = received(store, 0, 1, 30)
    store.run(Defer(got.receipt, 1.0))
    clock.advance(2)
    assert age_of(store) == pytest.approx(5.0)


@pytest.mark.parametrize("delay_s, after_s, age_s", [
    (0, 5, 5.0),    # waiting since it was sent
    (10, 12, 12.0),  # since it was sent, its delay too (the source text's measure)
    (10, 5, 0.0),   # still delayed: nothing of the key is waiting
])
def test_a_never_received_message_is_as_old_as_its_enqueue_once_visible(tmp_path, delay_s,
                                                                         after_s, age_s):
    clock = FakeClock(1000.0)
    store = open_store(tmp_path / "db", clock)
    store.run(Put(0, batch(message("a", delay_s=delay_s))))
    clock.advance(after_s)
    assert age_of(store) == pytest.approx(age_s)


def test_a_message_in_flight_is_not_waiting(tmp_path):
    clock = FakeClock(1000.0)
    store = open_store(tmp_path / "db", clock)
    store.run(Put(0, batch(message("a"))))
    clock.advance(4)
    assert received(store, 0, 1, 30)
    clock.advance(2)
    assert age_of(store) == 0.0
