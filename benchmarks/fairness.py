"""Fair dispatch: Jain's index of usage share among backlogged keys, waits, overhead.

    python benchmarks/fairness.py [--scale 1.0]

Three job types stay backlogged together: "heavy" (0.2 s handlers) and two
"light" ones (0.02 s). Plain FIFO gives heavy most of the thread time; the
coordinator (2 s windows, 0.5 s interval, 1 s latency threshold) should
intervene and even it out. Printed beside the FIFO baseline of the same run:
- Jain's fairness index of usage share per window among backlogged keys,
  from two windows after intervention starts (design target: >= 0.9);
- per-type wait p50 / p99;
- tiny-task throughput with the coordinator on (its overhead).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

import rayq  # noqa: E402
from rayq.config import Config, ConsumerConfig, FairnessConfig  # noqa: E402

WINDOW_S = 2.0
CONSUMERS = ConsumerConfig(count=2, max_load=2, poll_wait_s=0.3, adjust_interval_s=0.1)


@ray.remote(num_cpus=0)
class Spans:
    def __init__(self):
        self.spans = []

    def add(self, kind, started, ended):
        self.spans.append((kind, started, ended))

    def all(self):
        return list(self.spans)


def _work(kind: str, seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    ray.get(ray.get_actor("bench-spans", namespace="rayq-bench").add.remote(kind, started, time.time()))


@rayq.task(type="heavy")
def heavy(seconds):
    _work("heavy", seconds)


@rayq.task(type="light-a")
def light_a(seconds):
    _work("light-a", seconds)


@rayq.task(type="light-b")
def light_b(seconds):
    _work("light-b", seconds)


@rayq.task(type="tiny")
def tiny(i):
    return i


def jain(values: list[float]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def usage_per_window(spans, t0: float, until: float) -> list[dict[str, float]]:
    windows = []
    lo = t0
    while lo < until:
        hi = lo + WINDOW_S
        used: dict[str, float] = {}
        for kind, s, e in spans:
            used[kind] = used.get(kind, 0.0) + max(0.0, min(e, hi) - max(s, lo))
        windows.append(used)
        lo = hi
    return windows


def contended_run(enabled: bool, scale: float) -> dict:
    # No booster consumers here: both runs get the same threads.
    fairness = FairnessConfig(enabled=enabled, window_s=WINDOW_S, windows=6,
                              latency_threshold_s=1.0, interval_s=0.5, max_boost_consumers=0)
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-fair-"), consumers=0,
                        config=Config(consumers=CONSUMERS, fairness=fairness))
    spans = Spans.options(name="bench-spans", namespace="rayq-bench").remote()
    n_light = int(1000 * scale)  # and one heavy per ten of each light: equal thread time
    # The heavy type floods first, then the light ones queue behind it: FIFO gives
    # heavy every thread until it drains. The backlog is queued before any consumer
    # starts; each type has the same total thread time to do.
    calls = [(heavy, 0.2)] * (n_light // 10) + [
        c for _ in range(n_light) for c in ((light_a, 0.02), (light_b, 0.02))]
    with ThreadPoolExecutor(8) as pool:
        refs = list(pool.map(lambda c: client.submit(c[0], c[1]), calls))
    time.sleep(2 * fairness.interval_s)  # the coordinator sees the backlog
    t0 = time.time()
    client.scale_consumers(CONSUMERS.count)
    ray.get(refs)
    finished = time.time()
    # Backlogged together until the first type drains: measure windows up to then.
    ends = {}
    for kind, _, e in ray.get(spans.all.remote()):
        ends[kind] = max(ends.get(kind, 0.0), e)
    until = min(ends.values())
    windows = usage_per_window(ray.get(spans.all.remote()), t0, until - WINDOW_S)
    report_ = client.fairness()
    starts = [e["at"] for e in report_.history if e.get("kind") == "fairness" and e["intervening"]]
    first = min(starts) if starts else None
    index = [jain([w.get(k, 0.0) for k in ("heavy", "light-a", "light-b")]) for w in windows]
    after = [j for i, j in enumerate(index) if first and t0 + i * WINDOW_S >= first + 2 * WINDOW_S]
    waits = {r.type: r for r in client.task_stats(by="type")}
    ray.kill(spans)
    rayq.shutdown()
    return {"jain": index, "jain_after": after, "intervened_after_s": (first - t0) if first else None,
            "waits": waits, "seconds": finished - t0}


def tiny_throughput(enabled: bool, tasks: int) -> float:
    fairness = FairnessConfig(enabled=enabled, interval_s=0.5)
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-fair-"),
                        config=Config(consumers=ConsumerConfig(count=2), fairness=fairness))
    ray.get(client.submit(tiny, -1))
    with Timer() as t, ThreadPoolExecutor(8) as pool:
        ray.get(list(pool.map(lambda i: client.submit(tiny, i), range(tasks))))
    rayq.shutdown()
    return tasks / t.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--tasks", type=int, default=2000)
    args = parser.parse_args()
    ray.init(namespace="rayq", include_dashboard=False, log_to_driver=False)
    fifo, fair = contended_run(False, args.scale), contended_run(True, args.scale)
    fifo_rate, fair_rate = tiny_throughput(False, args.tasks), tiny_throughput(True, args.tasks)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    rows = [
        {"figure": "Jain's index, mean over backlogged windows (2 windows after intervention)",
         "value": mean(fair["jain_after"]), "unit": "index", "baseline": "FIFO, all windows",
         "baseline_value": mean(fifo["jain"])},
        {"figure": "Jain's index, worst such window", "value": min(fair["jain_after"], default=0.0),
         "unit": "index", "baseline": "FIFO, worst window", "baseline_value": min(fifo["jain"], default=0.0)},
    ]
    for kind in ("heavy", "light-a", "light-b"):
        for q in ("p50", "p99"):
            field = f"wait_{q}_s"
            rows.append({"figure": f"{kind} wait {q}", "value": getattr(fair["waits"][kind], field),
                         "unit": "s", "baseline": "FIFO",
                         "baseline_value": getattr(fifo["waits"][kind], field)})
    rows.append({"figure": "tiny tasks with the coordinator on", "value": fair_rate,
                 "unit": "tasks/s", "baseline": "fairness off", "baseline_value": fifo_rate})
    report("fairness", rows, {"jain_per_window_fair": fair["jain"], "jain_per_window_fifo": fifo["jain"],
                              "intervened_after_s": fair["intervened_after_s"], "window_s": WINDOW_S,
                              "scale": args.scale})


if __name__ == "__main__":
    main()
