"""In-process shard store throughput against raw LMDB with the same durability.

    python benchmarks/store.py [--messages 100000] [--batch 500] [--body-bytes 200]

Every figure is next to a baseline measured in the same run doing the same work on
raw LMDB (sync=True, metasync=True, writemap=False, one transaction per batch):
- put: write a batch of rows;
- receive: move a batch of rows from the head of the range to a later key (how a
  received message is hidden);
- delete: delete a batch of rows by key;
- end to end: the three transactions in turn for each batch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile

import lmdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

from rayq.config import StoreConfig  # noqa: E402
from rayq.core.codec.model import NewMessage, encode_body  # noqa: E402
from rayq.core.codec.wire import decode_delivered, encode_messages  # noqa: E402
from rayq.core.storage.store import open_store  # noqa: E402
from rayq.core.storage.writes import Delete, Put, Receive  # noqa: E402


ROW_KEY = struct.Struct(">IIQQ")  # (subqueue, key id, visible at, seq), as the store's rows
HIDDEN = 1 << 62  # a "visible at" later than every visible row


class RawLmdb:
    """The store's three batch transactions on a bare LMDB table, fsync'd like the store."""

    def __init__(self, path: str, body: bytes):
        self.env = lmdb.open(path, map_size=1 << 30, sync=True, metasync=True, writemap=False,
                             max_dbs=2)
        self.db, self.body = self.env.open_db(b"rows"), body

    def put(self, first_seq: int, n: int) -> None:
        with self.env.begin(write=True) as txn:
            for seq in range(first_seq, first_seq + n):
                txn.put(ROW_KEY.pack(1, 1, seq, seq), self.body, db=self.db)

    def receive(self, n: int) -> list[bytes]:
        """Hide the first ``n`` visible rows; their new keys (what a receipt points at)."""
        moved = []
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor(db=self.db)
            cursor.set_range(ROW_KEY.pack(1, 1, 0, 0))
            for key, value in cursor:
                sq, kid, visible_at, seq = ROW_KEY.unpack(key)
                if visible_at >= HIDDEN or len(moved) == n:
                    break
                moved.append((key, ROW_KEY.pack(sq, kid, HIDDEN + seq, seq), value))
            for old, new, value in moved:
                txn.delete(old, db=self.db)
                txn.put(new, value, db=self.db)
        return [new for _, new, _ in moved]

    def delete(self, keys: list[bytes]) -> None:
        with self.env.begin(write=True) as txn:
            for key in keys:
                txn.delete(key, db=self.db)

    def close(self) -> None:
        self.env.close()


def raw_lmdb_figures(path: str, messages: int, batch: int, body: bytes) -> dict[str, float]:
    """msg/s of raw LMDB doing each of the store's operations (see the module docstring)."""
    raw = RawLmdb(path, body)
    raw.put(0, batch)  # warm-up: one batch through all three operations, as the store gets
    raw.delete(raw.receive(batch))
    with Timer() as t_put:
        for start in range(0, messages, batch):
            raw.put(batch + start, batch)
    keys = []
    with Timer() as t_recv:
        for _ in range(0, messages, batch):
            keys.extend(raw.receive(batch))
    with Timer() as t_del:
        for start in range(0, len(keys), batch):
            raw.delete(keys[start:start + batch])
    assert len(keys) == messages, "the raw baseline lost rows"
    with Timer() as t_e2e:
        for start in range(0, messages, batch):
            raw.put(batch + messages + start, batch)
            raw.delete(raw.receive(batch))
    raw.close()
    return {"put": messages / t_put.seconds, "receive": messages / t_recv.seconds,
            "delete": messages / t_del.seconds, "end_to_end": messages / t_e2e.seconds}


def store_figures(path: str, messages: int, batch: int, body_bytes: int) -> dict[str, float]:
    store = open_store(path, config=StoreConfig(initial_map_bytes=1 << 30))
    body = encode_body(os.urandom(body_bytes // 2).hex()[:body_bytes], 1 << 24)
    outgoing = [NewMessage(body, f"t{i % 8}", f"type{i % 4}", f"type{i % 4}") for i in range(batch)]

    def put() -> None:
        store.run(Put(1, encode_messages(outgoing)))

    def receive() -> list[str]:
        return [m.receipt for m in decode_delivered(store.run(Receive(1, batch, 300)))]

    put()  # warm-up: one batch through all three operations
    store.run(Delete(receive()))
    with Timer() as t_put:
        for _ in range(0, messages, batch):
            put()
    receipts = []
    with Timer() as t_recv:
        for _ in range(0, messages, batch):
            receipts.extend(receive())
    with Timer() as t_del:
        for start in range(0, len(receipts), batch):
            store.run(Delete(receipts[start:start + batch]))
    assert len(receipts) == messages and store.count(1) == 0, "benchmark lost messages"
    with Timer() as t_e2e:
        for _ in range(0, messages, batch):
            put()
            store.run(Delete(receive()))
    store.close()
    return {"put": messages / t_put.seconds, "receive": messages / t_recv.seconds,
            "delete": messages / t_del.seconds, "end_to_end": messages / t_e2e.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--body-bytes", type=int, default=200)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rayq-bench-")
    try:
        body = os.urandom(args.body_bytes)
        raw = raw_lmdb_figures(os.path.join(root, "raw"), args.messages, args.batch, body)
        got = store_figures(os.path.join(root, "store"), args.messages, args.batch, args.body_bytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [{"figure": f"store {name.replace('_', ' ')}", "value": value, "unit": "msg/s",
             "baseline": f"raw LMDB {name.replace('_', ' ')}", "baseline_value": raw[name]}
            for name, value in got.items()]
    report("store", rows, {"messages": args.messages, "batch": args.batch,
                           "body_bytes": args.body_bytes})


if __name__ == "__main__":
    main()
