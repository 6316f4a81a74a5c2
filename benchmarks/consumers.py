"""Task throughput for tiny handlers, and polling with hit-rate balancing vs fixed rate.

    python benchmarks/consumers.py [--tasks 3000] [--seconds 8] [--rate 100]

Every figure beside a baseline measured in the same run:
- tiny-task throughput (submit -> consumer runs it -> ray.get, durable) beside
  the same number of plain Ray tasks (not durable, no queue);
- empty polls per second on an idle queue, and delivered tasks per second
  under a steady trickle, with hit-rate balancing beside consumers pinned at
  max_load pollers (fixed-rate polling).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _peers import plain_ray_tasks  # noqa: E402
from _report import local_ray, report, submit_then_wait  # noqa: E402

import rayq  # noqa: E402
from rayq.config import Config, ConsumerConfig  # noqa: E402


@rayq.task(type="noop")
def noop(i):
    return i


def tiny_task_throughput(client, tasks: int, threads: int = 8) -> float:
    """Durable tiny tasks per second: submitted from ``threads`` threads, then ray.get of all."""
    ray.get(client.submit(noop, -1))  # register and warm up
    return submit_then_wait(lambda i: client.submit(noop, i), ray.get, tasks, threads)


def _counters(client) -> tuple[int, int]:
    """(empty polls, hits) summed over the consumers."""
    stats = client.consumer_stats()
    return sum(s.empty_polls for s in stats), sum(s.hits for s in stats)


def polling(client, seconds: float, rate: float, fixed: int | None) -> dict:
    """Empty polls/s while idle, then delivered and empty polls/s under a trickle."""
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
        refs += [client.submit(noop, i) for i in range(len(refs), due)]
        time.sleep(0.005)
    ray.get(refs)
    empty2, hits2 = _counters(client)
    busy_s = time.monotonic() - start
    return {"idle_empty_per_s": idle_empty, "delivered_per_s": (hits2 - hits1) / busy_s,
            "busy_empty_per_s": (empty2 - empty1) / busy_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    local_ray(namespace="rayq", include_dashboard=False, log_to_driver=False)
    config = Config(consumers=ConsumerConfig(count=2, poll_wait_s=1.0, adjust_interval_s=0.5))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-bench-"), config=config)
    try:
        tasks_per_s = tiny_task_throughput(client, args.tasks)
        ray_per_s = plain_ray_tasks(args.tasks, threads=1)
        balanced = polling(client, args.seconds, args.rate, fixed=None)
        fixed = polling(client, args.seconds, args.rate, fixed=config.consumers.max_load)
    finally:
        rayq.shutdown()
    rows = [
        {"figure": "tiny tasks, submit -> ray.get (durable)", "value": tasks_per_s,
         "unit": "tasks/s", "baseline": "plain Ray tasks", "baseline_value": ray_per_s},
        {"figure": "empty polls, idle queue, hit-rate balanced", "value": balanced["idle_empty_per_s"],
         "unit": "polls/s", "baseline": "fixed-rate (max_load pollers)",
         "baseline_value": fixed["idle_empty_per_s"]},
        {"figure": f"delivered, {args.rate:.0f} tasks/s trickle, balanced",
         "value": balanced["delivered_per_s"], "unit": "tasks/s", "baseline": "fixed-rate",
         "baseline_value": fixed["delivered_per_s"]},
        {"figure": "empty polls under the trickle, balanced", "value": balanced["busy_empty_per_s"],
         "unit": "polls/s", "baseline": "fixed-rate", "baseline_value": fixed["busy_empty_per_s"]},
    ]
    report("consumers", rows, {"tasks": args.tasks, "seconds": args.seconds, "rate": args.rate})


if __name__ == "__main__":
    main()
