"""What signing costs: a signed account's client beside an unsigned one, same runtime.

    python benchmarks/auth.py [--seconds 5] [--batches 100]

Each figure is printed beside the same operation from the unsigned (default
account) client, measured in the same run:
- single durable send() from 4 producer threads (a signature per send);
- send_batch of 500 messages (one signature over all 500);
- receive -> delete round trips, one message at a time;
- count() calls (a signed read waits for its nonce's group commit);
- verifications per second of the pure verifier, beside bare HMAC-SHA256;
- durable nonces alone: LMDB group commits of 8 puts with their 8 nonces written in
  the same transaction, beside the same commits without nonces.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import shutil
import sys
import tempfile
import threading
import time

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, local_ray, report, run_threads  # noqa: E402

import rayq  # noqa: E402
from rayq.config import StoreConfig  # noqa: E402
from rayq.core.auth import nonces  # noqa: E402
from rayq.core.auth.accounts import Accounts, Signer, Verifier  # noqa: E402
from rayq.core.auth.operations import SHARD_OPS  # noqa: E402
from rayq.core.codec.wire import encode_messages  # noqa: E402
from rayq.core.codec.model import NewMessage, encode_body  # noqa: E402
from rayq.core.storage.store import open_store  # noqa: E402
from rayq.core.storage.writes import Put  # noqa: E402
from rayq.testing import MemoryKV  # noqa: E402

BATCH = 500
BODY = "x" * 200
PUT = SHARD_OPS["put"]


def single_sends(client: rayq.Client, queue: str, seconds: float, producers: int = 4) -> float:
    q = client.queue(queue)
    counts, stop = [0] * producers, threading.Event()

    def send(i: int):
        while not stop.is_set():
            q.send(BODY)
            counts[i] += 1

    ran_s = run_threads(send, producers, seconds, stop)
    return sum(counts) / ran_s


def batches(client: rayq.Client, queue: str, n: int) -> float:
    q = client.queue(queue)
    batch = [rayq.Outgoing(BODY) for _ in range(BATCH)]
    with Timer() as t:
        for _ in range(n):
            q.send_batch(batch)
    return n * BATCH / t.seconds


def round_trips(client: rayq.Client, queue: str, n: int = 300) -> float:
    q = client.queue(queue)
    with Timer() as t:
        for _ in range(n):
            [m] = q.receive(visibility_timeout_s=60)
            q.delete(m.receipt)
    return n / t.seconds


def counts(client: rayq.Client, queue: str, n: int = 300) -> float:
    q = client.queue(queue)
    with Timer() as t:
        for _ in range(n):
            q.count()
    return n / t.seconds


def nonce_commits(root: str, n: int = 200, calls: int = 8) -> tuple[float, float]:
    """(group commits/s with each call's nonce in the transaction, commits/s without)."""
    signer = Signer("acme", Accounts(MemoryKV()).create("acme"))
    message = encode_messages([NewMessage(encode_body(BODY, 1 << 20), "acme", "default",
                                          "default")])
    store = open_store(os.path.join(root, "nonce-store"), config=StoreConfig())
    rates = []
    try:
        for with_nonces in (True, False):
            with Timer() as t:
                for _ in range(n):
                    keys = [nonces.nonce_key(signer.sign(PUT, i, b"", queue="q")) for i in range(calls)]
                    also = (lambda txn, keys=keys: nonces.remember(txn, keys, time.time())
                            ) if with_nonces else None
                    store.group([Put(1, message)] * calls, also)
            rates.append(n / t.seconds)
    finally:
        store.close()
    return rates[0], rates[1]


def verifications(n: int = 20_000) -> tuple[float, float]:
    accounts = Accounts(MemoryKV())
    signer = Signer("acme", accounts.create("acme"))
    args = (7, [BODY] * 10)
    sigs = [signer.sign(PUT, *args, queue="jobs") for _ in range(n)]
    verifier = Verifier(accounts.keys)
    with Timer() as t:
        for sig in sigs:
            verifier.verify(sig, "jobs", PUT.name, PUT.body(PUT.bind(*args)), time.time())
    key, message = os.urandom(32), b"x" * 300
    with Timer() as bare:
        for _ in range(n):
            hmac.compare_digest(hmac.new(key, message, hashlib.sha256).hexdigest(), "0" * 64)
    return n / t.seconds, n / bare.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rayq-bench-")
    local_ray(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    try:
        admin = rayq.start(data_dir=os.path.join(root, "data"), consumers=0)
        signed = rayq.connect(account="bench", key=admin.create_account("bench"))
        admin.create_queue("plain", max_receives=None)
        signed.create_queue("signed", max_receives=None)
        for client, queue in ((admin, "plain"), (signed, "signed")):  # warm-up, not measured
            single_sends(client, queue, 1.0)
            counts(client, queue, 20)
        sides = [("unsigned", admin, "plain"), ("signed", signed, "signed")]
        runs: dict[str, list] = {name: [] for name, _, _ in sides}
        for r in range(2):  # two rounds; each side goes first once, the mean is reported
            for name, client, queue in (sides if r == 0 else sides[::-1]):
                runs[name].append((single_sends(client, queue, args.seconds / 2),
                                   batches(client, queue, max(1, args.batches // 2)),
                                   round_trips(client, queue), counts(client, queue)))
        figures = {name: tuple(sum(col) / len(col) for col in zip(*rows))
                   for name, rows in runs.items()}
        per_s, bare = verifications()
        with_nonces, without = nonce_commits(root)
    finally:
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    (s_send, s_batch, s_trip, s_count), (u_send, u_batch, u_trip, u_count) = (
        figures["signed"], figures["unsigned"])
    rows = [
        {"figure": "send() x4 producers, signed", "value": s_send, "unit": "msg/s",
         "baseline": "unsigned", "baseline_value": u_send},
        {"figure": f"send_batch of {BATCH}, signed", "value": s_batch, "unit": "msg/s",
         "baseline": "unsigned", "baseline_value": u_batch},
        {"figure": "receive -> delete, signed", "value": s_trip, "unit": "trips/s",
         "baseline": "unsigned", "baseline_value": u_trip},
        {"figure": "count(), signed (nonce committed)", "value": s_count, "unit": "calls/s",
         "baseline": "unsigned", "baseline_value": u_count},
        {"figure": "verifications (pure Python)", "value": per_s, "unit": "per s",
         "baseline": "bare HMAC-SHA256 + compare", "baseline_value": bare},
        {"figure": "group commits of 8 puts + 8 nonces", "value": with_nonces, "unit": "commits/s",
         "baseline": "same commits, no nonces", "baseline_value": without},
    ]
    report("auth", rows, {"batch": BATCH, "body_bytes": len(BODY), "seconds": args.seconds})


if __name__ == "__main__":
    main()
