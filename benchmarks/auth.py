"""What signing costs: a signed account's client beside an unsigned one, same runtime.

    python benchmarks/auth.py [--seconds 5] [--batches 100] [--rounds 2]

Each figure is printed beside the same operation from the unsigned (default
account) client, measured in the same run. Both clients are warmed up first, and
the work is split into rounds that alternate which side goes first, so neither
always meets a fresher (or more loaded) runtime; each figure is the mean of its rounds:
- single durable send() from 4 producer threads (a signature per send);
- send_batch of 500 messages (one signature over all 500);
- receive -> delete round trips, one message at a time;
- verifications per second of the pure verifier, beside bare HMAC-SHA256.
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
from _report import Timer, report, run_threads  # noqa: E402

import rayq  # noqa: E402
from rayq.core.auth import Accounts, Signer, Verifier, request_body  # noqa: E402
from rayq.testing import MemoryKV  # noqa: E402

BATCH = 500
BODY = "x" * 200


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


def warm_up(client: rayq.Client, queue: str) -> None:
    """One of each operation, untimed: connections, routes and caches are ready."""
    q = client.queue(queue)
    q.send(BODY)
    q.send_batch([rayq.Outgoing(BODY)])
    for m in q.receive(max_messages=2, visibility_timeout_s=60):
        q.delete(m.receipt)


def measure(sides: dict, args) -> dict[str, tuple[float, float, float]]:
    """(sends/s, batch msg/s, trips/s) per side: the mean over rounds that alternate
    which side runs first."""
    runs: dict[str, list] = {name: [] for name in sides}
    rounds = max(1, args.rounds)
    for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            client, queue = sides[name]
            runs[name].append((single_sends(client, queue, args.seconds / rounds),
                               batches(client, queue, max(1, args.batches // rounds)),
                               round_trips(client, queue, max(1, 300 // rounds))))
    return {name: tuple(sum(col) / len(col) for col in zip(*rows)) for name, rows in runs.items()}


def verifications(n: int = 20_000) -> tuple[float, float]:
    accounts = Accounts(MemoryKV())
    signer = Signer("acme", accounts.create("acme"))
    args = (7, [BODY] * 10)
    sigs = [signer.sign("jobs", "put", *args) for _ in range(n)]
    verifier = Verifier(accounts.keys)
    with Timer() as t:
        for sig in sigs:
            verifier.verify(sig, "jobs", "put", request_body(*args), time.time())
    key, message = os.urandom(32), b"x" * 300
    with Timer() as bare:
        for _ in range(n):
            hmac.compare_digest(hmac.new(key, message, hashlib.sha256).hexdigest(), "0" * 64)
    return n / t.seconds, n / bare.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rayq-bench-")
    ray.init(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    try:
        admin = rayq.start(data_dir=os.path.join(root, "data"), consumers=0)
        signed = rayq.connect(account="bench", key=admin.create_account("bench"))
        admin.create_queue("plain", max_receives=None)
        signed.create_queue("signed", max_receives=None)
        sides = {"unsigned": (admin, "plain"), "signed": (signed, "signed")}
        for client, queue in sides.values():
            warm_up(client, queue)
        figures = measure(sides, args)
        per_s, bare = verifications()
    finally:
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    (s_send, s_batch, s_trip), (u_send, u_batch, u_trip) = figures["signed"], figures["unsigned"]
    rows = [
        {"figure": "send() x4 producers, signed", "value": s_send, "unit": "msg/s",
         "baseline": "unsigned", "baseline_value": u_send},
        {"figure": f"send_batch of {BATCH}, signed", "value": s_batch, "unit": "msg/s",
         "baseline": "unsigned", "baseline_value": u_batch},
        {"figure": "receive -> delete, signed", "value": s_trip, "unit": "trips/s",
         "baseline": "unsigned", "baseline_value": u_trip},
        {"figure": "verifications (pure Python)", "value": per_s, "unit": "per s",
         "baseline": "bare HMAC-SHA256 + compare", "baseline_value": bare},
    ]
    report("auth", rows, {"batch": BATCH, "body_bytes": len(BODY), "seconds": args.seconds,
                          "rounds": args.rounds})


if __name__ == "__main__":
    main()
