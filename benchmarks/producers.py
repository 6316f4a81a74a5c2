"""Durable single send() from 8 threads: a client per thread beside one shared client.

    python benchmarks/producers.py [--seconds 5] [--rounds 3] [--threads 8]

Three ways for threads of one process to send to one queue, each measured
``--rounds`` times in turn (the median is printed; the machine's other load moves
single runs):
- a ``rayq.connect()`` client per thread: they share one transport, so their sends
  coalesce into shared puts;
- one client shared by the threads (the baseline);
- a client per thread over a transport of its own (``rayq.Client`` built directly),
  whose sends never coalesce with the other threads': what a client per thread was
  before connect shared transports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import local_ray, rate_on_threads, report  # noqa: E402

import rayq  # noqa: E402
from actors.lifecycle import find_runtime  # noqa: E402

BODY = "x" * 100
QUEUE = "bench-producers"


def private_client() -> rayq.Client:
    """A client over a transport of its own (not shared with any other)."""
    found = find_runtime()
    return rayq.Client(found["manager"], found["shards"], found["config"])


def sends_per_s(queues: list[rayq.Queue], seconds: float) -> float:
    """send() calls a second, thread i sending through ``queues[i]``."""
    return rate_on_threads(lambda i: queues[i].send(BODY, tenant=f"t{i}"), len(queues), seconds)


def measure(threads: int, seconds: float, rounds: int) -> dict[str, float]:
    shared = rayq.connect().queue(QUEUE)
    modes = {
        "connect per thread": lambda: [rayq.connect().queue(QUEUE) for _ in range(threads)],
        "one shared client": lambda: [shared] * threads,
        "own transport per thread": lambda: [private_client().queue(QUEUE)
                                             for _ in range(threads)],
    }
    runs: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, queues in modes.items():
            runs[mode].append(sends_per_s(queues(), seconds))
    for mode, rates in runs.items():
        print(f"{mode}: " + ", ".join(f"{r:,.0f}" for r in rates) + " sends/s")
    return {mode: statistics.median(rates) for mode, rates in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rayq-bench-")
    local_ray(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    try:
        rayq.start(data_dir=os.path.join(root, "data"), consumers=0).create_queue(
            QUEUE, max_receives=None)
        rates = measure(args.threads, args.seconds, args.rounds)
    finally:
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    base = rates["one shared client"]
    report("producers", [
        {"figure": f"send() x {args.threads} threads, {mode}", "value": rate,
         "unit": "msg/s", "baseline": "one shared client", "baseline_value": base}
        for mode, rate in rates.items() if mode != "one shared client"])


if __name__ == "__main__":
    main()
