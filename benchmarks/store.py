"""In-process shard store throughput against raw LMDB with the same durability.

    python benchmarks/store.py [--messages 100000] [--batch 500] [--body-bytes 200]

Every figure is next to a baseline measured in the same run: raw batched LMDB
puts (sync=True, metasync=True, writemap=False, one transaction per batch).
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
from rayq.core.model import NewMessage, encode_body  # noqa: E402
from rayq.core.store import open_store  # noqa: E402


def raw_lmdb_puts(path: str, messages: int, batch: int, body: bytes) -> float:
    env = lmdb.open(path, map_size=1 << 30, sync=True, metasync=True, writemap=False, max_dbs=2)
    db = env.open_db(b"rows")
    key = struct.Struct(">IIQQ")
    with Timer() as t:
        for start in range(0, messages, batch):
            with env.begin(write=True) as txn:
                for seq in range(start, min(start + batch, messages)):
                    txn.put(key.pack(1, 1, seq, seq), body, db=db)
    env.close()
    return messages / t.seconds


def store_figures(path: str, messages: int, batch: int, body_bytes: int) -> dict[str, float]:
    store = open_store(path, config=StoreConfig(initial_map_bytes=1 << 30))
    body = encode_body(os.urandom(body_bytes // 2).hex()[:body_bytes], 1 << 24)
    outgoing = [NewMessage(body, f"t{i % 8}", f"type{i % 4}", f"type{i % 4}") for i in range(batch)]
    with Timer() as t_put:
        for _ in range(0, messages, batch):
            store.put(1, outgoing)
    receipts = []
    with Timer() as t_recv:
        for _ in range(0, messages, batch):
            receipts.extend(m.receipt for m in store.receive(1, batch, 300))
    with Timer() as t_del:
        for start in range(0, len(receipts), batch):
            store.delete(receipts[start:start + batch])
    assert len(receipts) == messages and store.count(1) == 0, "benchmark lost messages"
    with Timer() as t_e2e:
        for _ in range(0, messages, batch):
            store.put(1, outgoing)
            store.delete([m.receipt for m in store.receive(1, batch, 300)])
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
        raw = raw_lmdb_puts(os.path.join(root, "raw"), args.messages, args.batch, body)
        got = store_figures(os.path.join(root, "store"), args.messages, args.batch, args.body_bytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = {"baseline": "raw LMDB puts", "baseline_value": raw}
    rows = [{"figure": f"store {name}", "value": value, "unit": "msg/s", **base}
            for name, value in got.items()]
    report("store", rows, {"messages": args.messages, "batch": args.batch,
                           "body_bytes": args.body_bytes})


if __name__ == "__main__":
    main()
