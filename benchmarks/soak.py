"""Soak: a steady multi-tenant workload for a bounded time, sampling throughput and
memory of every runtime process; both should stay flat within noise. Besides the
unsigned producer, receiver and task submitter, a signed account sends, receives
and deletes one message at a time (a signature, and a remembered nonce, per call).

    python benchmarks/soak.py [--seconds 60] [--sample 5]

Each row is one sample interval; the baseline of every figure is the first
interval of the same run (after a warm-up interval that is not counted).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import psutil
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import local_ray, report  # noqa: E402

import rayq  # noqa: E402
from rayq.config import Config, ConsumerConfig  # noqa: E402


@rayq.task(type="soak")
def soak_task(i):
    return i


ACTORS = ("ShardActor", "ConsumerActor", "QueueManager", "FairnessCoordinator", "FloodDetector")


def runtime_private_mib() -> float:
    """Private (anonymous) memory of every rayq actor process: resident memory without
    the LMDB file pages the kernel maps in and may drop at will."""
    total = 0
    for p in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if any(f"ray::{name}" in cmd for name in ACTORS):
            info = p.info["memory_info"]
            total += info.rss - info.shared
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sample", type=float, default=5.0)
    args = parser.parse_args()
    local_ray(namespace="rayq", include_dashboard=False, log_to_driver=False)
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-soak-"),
                        config=Config(consumers=ConsumerConfig(count=2)))
    queue = client.create_queue("soak", max_receives=None)
    soak_key = client.create_account("soaker")
    counts = {"sent": 0, "received": 0, "tasks": 0, "signed": 0}
    stop = threading.Event()

    def produce():  # 500 messages a second, which the receiver keeps up with
        q = rayq.connect().queue("soak")
        while not stop.is_set():
            q.send_batch([rayq.Outgoing("x" * 200, tenant=f"t{i % 5}", type="soak") for i in range(100)])
            counts["sent"] += 100
            time.sleep(0.2)

    def consume():
        q = rayq.connect().queue("soak")
        while not stop.is_set():
            got = q.receive(max_messages=100, wait_s=1)
            if got:
                q.delete_batch([m.receipt for m in got])
                counts["received"] += len(got)

    def signed():  # one message at a time through a signed account: a signature per call
        c = rayq.connect(account="soaker", key=soak_key)
        q = c.create_queue("soak-signed", max_receives=None)
        while not stop.is_set():
            q.send("x" * 200)
            for m in q.receive(max_messages=10):
                q.delete(m.receipt)
                counts["signed"] += 1

    def submit():
        c = rayq.connect()
        while not stop.is_set():
            ray.get([c.submit(soak_task, i, tenant=f"t{i % 3}") for i in range(20)])
            counts["tasks"] += 20

    workers = [threading.Thread(target=f) for f in (produce, consume, submit, signed)]
    for w in workers:
        w.start()
    samples = []
    time.sleep(args.sample)  # warm-up, not counted
    last, t_last = dict(counts), time.monotonic()
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(args.sample)
        now, snap = time.monotonic(), dict(counts)
        span = now - t_last
        samples.append({"received_per_s": (snap["received"] - last["received"]) / span,
                        "tasks_per_s": (snap["tasks"] - last["tasks"]) / span,
                        "signed_per_s": (snap["signed"] - last["signed"]) / span,
                        "runtime_private_mib": runtime_private_mib()})
        last, t_last = snap, now
    stop.set()
    for w in workers:
        w.join()
    depth = queue.count()
    rayq.shutdown()
    first = samples[0]
    rows = [{"figure": f"{name} at {i * args.sample + args.sample:.0f}s", "value": s[name],
             "unit": unit, "baseline": "first interval", "baseline_value": first[name]}
            for i, s in enumerate(samples)
            for name, unit in (("received_per_s", "msg/s"), ("tasks_per_s", "tasks/s"),
                               ("signed_per_s", "msg/s"), ("runtime_private_mib", "MiB"))]
    report("soak", rows, {"samples": samples, "seconds": args.seconds, "left_in_queue": depth})


if __name__ == "__main__":
    main()
