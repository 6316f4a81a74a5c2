"""What running a handler as a Ray task costs: tiny tasks of a type with Ray options
beside the same tiny tasks of a plain type, on the consumers' threads.

    python benchmarks/placement.py [--calls 50] [--tasks 400]

Every figure beside the plain type's, measured in the same run after the same warm-up:
- latency of one tiny task (submit -> ray.get, one at a time), p50 and p90;
- throughput of ``--tasks`` tiny tasks submitted from 4 threads, then ray.get of all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import local_ray, report, submit_then_wait  # noqa: E402

import rayq  # noqa: E402
from rayq.config import Config, ConsumerConfig  # noqa: E402


@rayq.task(type="plain")
def plain(i):
    return i


@rayq.task(type="ray-cpu0", num_cpus=0)
def ray_cpu0(i):
    return i


@rayq.task(type="ray-default-cpu", runtime_env={"env_vars": {"RAYQ_BENCH": "1"}})
def ray_default_cpu(i):
    return i


def latencies_ms(client, fn, calls: int) -> list[float]:
    """Milliseconds of ``calls`` tiny tasks, one at a time, after two to warm up."""
    ray.get([client.submit(fn, -1), client.submit(fn, -2)])
    out = []
    for i in range(calls):
        began = time.perf_counter()
        ray.get(client.submit(fn, i))
        out.append((time.perf_counter() - began) * 1000)
    return sorted(out)


def p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=400)
    args = parser.parse_args()
    local_ray(namespace="rayq", num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = Config(consumers=ConsumerConfig(count=2, poll_wait_s=1.0, adjust_interval_s=0.5))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-bench-"), config=config)
    try:
        lat = {fn.spec.type: latencies_ms(client, fn, args.calls)
               for fn in (plain, ray_cpu0, ray_default_cpu)}
        rate = {fn.spec.type: submit_then_wait(lambda i, fn=fn: client.submit(fn, i), ray.get,
                                               args.tasks, 4)
                for fn in (plain, ray_cpu0)}
    finally:
        rayq.shutdown()
    base = lat["plain"]
    rows = []
    for name, what in (("ray-cpu0", "Ray task, num_cpus=0"),
                       ("ray-default-cpu", "Ray task, runtime_env, num_cpus 1 (default)")):
        rows += [{"figure": f"tiny task latency p50, {what}", "value": p(lat[name], 0.5),
                  "unit": "ms", "baseline": "plain type", "baseline_value": p(base, 0.5)},
                 {"figure": f"tiny task latency p90, {what}", "value": p(lat[name], 0.9),
                  "unit": "ms", "baseline": "plain type", "baseline_value": p(base, 0.9)}]
    rows.append({"figure": f"{args.tasks} tiny tasks from 4 threads, Ray task, num_cpus=0",
                 "value": rate["ray-cpu0"], "unit": "tasks/s", "baseline": "plain type",
                 "baseline_value": rate["plain"]})
    report("placement", rows, {"calls": args.calls, "tasks": args.tasks,
                               "mean_ms": {k: statistics.mean(v) for k, v in lat.items()}})


if __name__ == "__main__":
    main()
