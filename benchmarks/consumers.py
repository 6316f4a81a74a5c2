"""Task throughput for tiny handlers, and polling with hit-rate balancing vs fixed rate.

    python benchmarks/consumers.py [--tasks 3000] [--seconds 8] [--rate 100]

Every figure beside a baseline measured in the same run:
- tiny-task throughput (submit -> consumer runs it -> ray.get, durable) beside
  the same number of plain Ray tasks (not durable, no queue);
- empty polls per second on an idle queue, and under a steady trickle the empty
  polls per second and each task's wait (enqueue -> handler start, p50/p99), with
  hit-rate balancing beside consumers pinned at max_load pollers (fixed-rate
  polling). Both sides deliver the whole trickle, so the delivered rate equals the
  offered load on both: it is kept in the JSON as a check, not compared.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

import rayq  # noqa: E402
from rayq.config import Config, ConsumerConfig  # noqa: E402


@rayq.task(type="noop")
def noop(i):
    return i


@ray.remote(num_cpus=0)
def plain_noop(i):
    return i


def tiny_task_throughput(client, tasks: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    ray.get([client.submit(noop, -i) for i in range(1, 101)])  # register; warm up as plain_ray_tasks
    with Timer() as t, ThreadPoolExecutor(8) as pool:
        refs = list(pool.map(lambda i: client.submit(noop, i), range(tasks)))
        ray.get(refs)
    return tasks / t.seconds


def plain_ray_tasks(tasks: int) -> float:
    ray.get([plain_noop.remote(i) for i in range(100)])
    with Timer() as t:
        ray.get([plain_noop.remote(i) for i in range(tasks)])
    return tasks / t.seconds


def _counters(client) -> tuple[int, int]:
    """(empty polls, hits) summed over the consumers."""
    stats = client.consumer_stats()
    return sum(s.empty_polls for s in stats), sum(s.hits for s in stats)


def polling(client, seconds: float, rate: float, fixed: int | None, tenant: str) -> dict:
    """Empty polls/s while idle, then under a trickle (submitted as ``tenant``, so its
    waits can be told apart): delivered/s, empty polls/s, and the wait p50/p99."""
    from actors.consumer import named_consumers

    ray.get([h.set_fixed_load.remote(fixed) for h in named_consumers().values()])
    time.sleep(3)  # settle into the regime
    empty0, hits0 = _counters(client)
    time.sleep(seconds)
    empty1, hits1 = _counters(client)
    idle_empty = (empty1 - empty0) / seconds
    refs, start = [], time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1
        refs += [client.submit(noop, i, tenant=tenant) for i in range(len(refs), due)]
        time.sleep(0.005)
    ray.get(refs)
    empty2, hits2 = _counters(client)
    busy_s = time.monotonic() - start
    [waits] = [r for r in client.task_stats(by="tenant") if r.tenant == tenant]
    return {"idle_empty_per_s": idle_empty, "delivered_per_s": (hits2 - hits1) / busy_s,
            "busy_empty_per_s": (empty2 - empty1) / busy_s,
            "wait_p50_ms": waits.wait_p50_s * 1e3, "wait_p99_ms": waits.wait_p99_s * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    ray.init(namespace="rayq", include_dashboard=False, log_to_driver=False)
    config = Config(consumers=ConsumerConfig(count=2, poll_wait_s=1.0, adjust_interval_s=0.5))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-bench-"), config=config)
    try:
        tasks_per_s = tiny_task_throughput(client, args.tasks)
        ray_per_s = plain_ray_tasks(args.tasks)
        balanced = polling(client, args.seconds, args.rate, fixed=None, tenant="balanced")
        fixed = polling(client, args.seconds, args.rate, fixed=config.consumers.max_load,
                        tenant="fixed")
    finally:
        rayq.shutdown()
    rows = [
        {"figure": "tiny tasks, submit -> ray.get (durable)", "value": tasks_per_s,
         "unit": "tasks/s", "baseline": "plain Ray tasks", "baseline_value": ray_per_s},
        {"figure": "empty polls, idle queue, hit-rate balanced", "value": balanced["idle_empty_per_s"],
         "unit": "polls/s", "baseline": "fixed-rate (max_load pollers)",
         "baseline_value": fixed["idle_empty_per_s"]},
        {"figure": f"empty polls, {args.rate:.0f} tasks/s trickle, balanced",
         "value": balanced["busy_empty_per_s"], "unit": "polls/s", "baseline": "fixed-rate",
         "baseline_value": fixed["busy_empty_per_s"]},
        {"figure": "task wait p50 under the trickle, balanced", "value": balanced["wait_p50_ms"],
         "unit": "ms", "baseline": "fixed-rate", "baseline_value": fixed["wait_p50_ms"]},
        {"figure": "task wait p99 under the trickle, balanced", "value": balanced["wait_p99_ms"],
         "unit": "ms", "baseline": "fixed-rate", "baseline_value": fixed["wait_p99_ms"]},
    ]
    delivered = {"balanced": balanced["delivered_per_s"], "fixed": fixed["delivered_per_s"]}
    report("consumers", rows, {"tasks": args.tasks, "seconds": args.seconds, "rate": args.rate,
                               "delivered_per_s": delivered})


if __name__ == "__main__":
    main()
