"""Shards written in row format 2 open in the current format, on a leader and on a
follower that holds a copy of format-2 rows."""

from rayq.config import StoreConfig
from rayq.core.codec.model import NewMessage, decode_body, encode_body
from rayq.core.kit.kv import DATABASES, LmdbKV, Write
from rayq.core.storage import layout as rows
from rayq.core.replication.replica import Replica
from rayq.core.storage.store import ShardStore
from rayq.testing import FakeClock, plenty_of_memory
from rayq.core.storage.writes import ChangeVisibility, Put, Sweep
from tests.contract.helpers import batch, received

SPILLED_TO = 7  # where the sweep moves the spilled message back


def message(value) -> NewMessage:
    return NewMessage(encode_body(value, 1 << 20), "acme", "report", "k")


def open_store(kv, clock) -> ShardStore:
    return ShardStore(kv, clock=clock, config=StoreConfig(), memory_probe=plenty_of_memory)


def as_format_2(value: bytes) -> bytes:
    """A current row value as format 2 stored it: the same header without the 8 bytes of
    the first receive time after the nonce."""
    return value[:29] + value[37:]


def downgrade(kv) -> None:
    """Rewrite every row and spilled message of ``kv`` in format 2, by hand."""
    head = rows.SPILL_HEAD.size

    def write(txn) -> None:
        for key, value in list(txn.scan("rows", b"")):
            txn.put("rows", bytes(key), as_format_2(bytes(value)))
        for key, value in list(txn.scan("spill", b"")):
            txn.put("spill", bytes(key), bytes(value[:head]) + as_format_2(bytes(value[head:])))
        txn.put("meta", rows.ROW_FORMAT, b"2")
    kv.transact(write)


def format_2_shard(path, clock) -> tuple[str, str]:
    """A format-2 shard holding a message received once (returned: its receipt), one never
    received and one spilled; returns (receipt of the received one, its id)."""
    store = open_store(LmdbKV(path), clock)
    store.run(Put(0, batch(message("received"))))
    [got] = received(store, 0, 1, 60)
    store.run(Put(0, batch(message("waiting"))))
    store.set_diverts({0: [("report", "acme")]})
    store.run(Put(0, batch(message("spilled"))))
    store.close()
    kv = LmdbKV(path)
    downgrade(kv)
    kv.close()
    return got.receipt, got.id


def everything(kv) -> dict[str, list[tuple[bytes, bytes]]]:
    return kv.read(lambda txn: {table: [(bytes(k), bytes(v)) for k, v in txn.scan(table, b"")]
                                for table in DATABASES if table != "meta"})


def test_a_format_2_shard_opens_in_the_current_format_with_every_message_kept(tmp_path):
    clock = FakeClock(1_000.0)
    receipt, received_id = format_2_shard(tmp_path / "shard", clock)
    clock.advance(5)
    store = open_store(LmdbKV(tmp_path / "shard"), clock)
    assert store.kv.read(lambda txn: txn.get("meta", rows.ROW_FORMAT)) == rows.ROW_FORMAT_NOW
    store.run(ChangeVisibility(receipt, 0))  # a receipt handed out before the upgrade holds
    assert store.run(Sweep("report", "acme", SPILLED_TO, limit=10)) == 1
    clock.advance(5)
    got = {decode_body(m.body): m for q in (0, SPILLED_TO) for m in received(store, q, 10, 60)}
    assert {body: (m.dequeue_count, m.first_received_at_s) for body, m in got.items()} == {
        "received": (2, 1_000.0),      # first received when unknown: its enqueue time
        "waiting": (1, 1_010.0),       # never received: this receive's time
        "spilled": (1, 1_010.0)}
    assert got["received"].id == received_id
    store.close()


def test_the_first_receive_time_of_a_migrated_row_stays_put_over_later_receives(tmp_path):
    clock = FakeClock(1_000.0)
    format_2_shard(tmp_path / "shard", clock)
    store = open_store(LmdbKV(tmp_path / "shard"), clock)
    times = []
    for _ in range(3):
        clock.advance(60)
        times.append(sorted(m.first_received_at_s for m in received(store, 0, 10, 30)))
    assert times == [[1_000.0, 1_060.0]] * 3
    store.close()


def test_a_follower_with_format_2_rows_migrates_them_before_the_leaders_first_write_set(
        tmp_path):
    clock = FakeClock(1_000.0)
    format_2_shard(tmp_path / "leader", clock)
    follower_kv = LmdbKV(tmp_path / "follower")
    old = LmdbKV(tmp_path / "leader")
    copy = old.read(lambda txn: [Write(table, bytes(k), bytes(v)) for table in DATABASES
                                 for k, v in txn.scan(table, b"")])
    old.close()
    follower_kv.apply(copy)  # the follower was seeded while the leader wrote format 2
    leader = open_store(LmdbKV(tmp_path / "leader"), clock)  # migrates its own rows
    shipped = [tuple(Write("meta", bytes(k), bytes(v))
                     for k, v in leader.kv.read(lambda txn: list(txn.scan("meta", b""))))]
    leader.kv.watch(shipped.append)
    leader.run(Put(0, batch(message("after the upgrade"))))
    received(leader, 0, 10, 30)
    Replica(follower_kv).apply(1, 1, [tuple(w for ws in shipped for w in ws)])
    assert everything(follower_kv) == everything(leader.kv)
    leader.close()
    follower_kv.close()
