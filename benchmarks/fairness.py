"""Fair dispatch: quiet tenants during a noisy burst, weighted shares, the coordinator's
intervention (docs/fair-dispatch.md, docs/fairness-coordinator.md).

    python benchmarks/fairness.py [--scale 1.0] [--only burst,weights,intervention,overhead]

1. Burst (the noisy-burst scenario, default thresholds): FairnessConfig(key="tenant"), 2
   consumers; three quiet tenants each submit one 20 ms task every 0.5 s for 20 s;
   dwell = handler start - submit. Quiet tenants' p50/p99 dwell alone, during a
   noisy tenant's burst of 1 500 tasks of 200 ms with rayq's fair dispatch, and
   during the same burst with plain FIFO dispatch; and the noisy tenant's
   throughput in the window, fair beside FIFO. Target: p99 during the burst <= 2x
   p99 alone + one noisy handler (0.2 s); noisy throughput >= 0.9x FIFO's.
2. Weights: tenants gold (weight 4) and free (weight 1) both backlogged with 50 ms
   tasks; gold's share of handler time while both are backlogged (target 0.8 +- 10 %).
3. Intervention (docs/fairness-coordinator.md, scaled: 2 s windows, 0.5 s interval, 1 s latency
   threshold): three job types backlogged together, "heavy" (0.2 s) flooding first.
   Jain's index of usage share among backlogged keys, from two windows after the
   intervention starts, beside FIFO (no coordinator, FIFO dispatch) over the same
   windows; per-type waits.
4. Overhead: tiny-task throughput with fairness on beside fairness off.
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
from _report import Timer, local_ray, report  # noqa: E402

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


@rayq.task(type="job")
def timed_job(seconds):
    """Sleeps like a handler that waits on I/O; returns (started, ended) wall times."""
    started = time.time()
    time.sleep(seconds)
    return started, time.time()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


# -- 1. quiet tenants during a noisy burst ------------------------------------------------
QUIET_TENANTS, QUIET_EVERY_S, QUIET_TASK_S = ("quiet-a", "quiet-b", "quiet-c"), 0.5, 0.02
NOISY_TASKS, NOISY_TASK_S = 1500, 0.2


def burst_run(dispatch: str, noisy: bool, scale: float) -> dict:
    """Quiet tenants' dwell times (and the noisy tenant's rate) under default settings."""
    config = Config(fairness=FairnessConfig(key="tenant", dispatch=dispatch))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-burst-"), config=config)
    ray.get([client.submit(timed_job, 0.0, tenant=t) for t in QUIET_TENANTS])  # warm
    noisy_refs = []
    if noisy:
        with ThreadPoolExecutor(8) as pool:
            noisy_refs = list(pool.map(lambda _: client.submit(timed_job, NOISY_TASK_S,
                                                               tenant="noisy"),
                                       range(int(NOISY_TASKS * scale))))
    window_s = 20.0 * scale
    submitted: list[tuple[float, object]] = []
    t0 = time.time()
    ticks = int(window_s / QUIET_EVERY_S)
    noisy_marked: set[str] = set()
    for tick in range(ticks):
        time.sleep(max(0.0, t0 + tick * QUIET_EVERY_S - time.time()))
        for tenant in QUIET_TENANTS:
            submitted.append((time.time(), client.submit(timed_job, QUIET_TASK_S, tenant=tenant)))
        if tick == ticks // 2:  # what the shards treat as noisy mid-burst
            noisy_marked = {k.key for k in client.fairness().noisy}
    dwell = [started - at for at, (started, _) in zip(
        (at for at, _ in submitted), ray.get([ref for _, ref in submitted]))]
    noisy_spans = ray.get(noisy_refs)
    t1 = t0 + window_s
    noisy_rate = sum(1 for started, _ in noisy_spans if t0 <= started < t1) / window_s
    rayq.shutdown()
    return {"p50": percentile(dwell, 0.5), "p99": percentile(dwell, 0.99),
            "noisy_per_s": noisy_rate, "noisy_marked_mid_burst": sorted(noisy_marked)}


def burst(scale: float) -> tuple[list[dict], dict]:
    alone = burst_run("fair", noisy=False, scale=scale)
    fair = burst_run("fair", noisy=True, scale=scale)
    fifo = burst_run("fifo", noisy=True, scale=scale)
    target = 2 * alone["p99"] + NOISY_TASK_S
    rows = [
        {"figure": "quiet dwell p50, burst, fair dispatch", "value": fair["p50"], "unit": "s",
         "baseline": "alone", "baseline_value": alone["p50"]},
        {"figure": "quiet dwell p99, burst, fair dispatch", "value": fair["p99"], "unit": "s",
         "baseline": "alone", "baseline_value": alone["p99"]},
        {"figure": "quiet dwell p99, burst, fair dispatch", "value": fair["p99"], "unit": "s",
         "baseline": "target: 2x alone + 0.2 s", "baseline_value": target},
        {"figure": "quiet dwell p50, burst, FIFO dispatch", "value": fifo["p50"], "unit": "s",
         "baseline": "alone", "baseline_value": alone["p50"]},
        {"figure": "quiet dwell p99, burst, FIFO dispatch", "value": fifo["p99"], "unit": "s",
         "baseline": "alone", "baseline_value": alone["p99"]},
        {"figure": "noisy tenant tasks/s in the window, fair", "value": fair["noisy_per_s"],
         "unit": "tasks/s", "baseline": "FIFO", "baseline_value": fifo["noisy_per_s"]},
    ]
    return rows, {"burst": {"alone": alone, "fair": fair, "fifo": fifo}}


# -- 2. weighted shares ----------------------------------------------------------------------
def weights_run(scale: float) -> tuple[list[dict], dict]:
    """gold (weight 4) and free (weight 1) backlogged together: gold's handler-time share."""
    config = Config(fairness=FairnessConfig(key="tenant", weights={"gold": 4}))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-weights-"), config=config)
    n = int(1200 * scale)
    with ThreadPoolExecutor(8) as pool:
        refs = {t: list(pool.map(lambda _, t=t: client.submit(timed_job, 0.05, tenant=t),
                                 range(n))) for t in ("gold", "free")}
    spans = {t: ray.get(r) for t, r in refs.items()}
    rayq.shutdown()
    both_until = min(max(end for _, end in spans[t]) for t in spans)  # one drained then
    start = max(min(s for s, _ in spans[t]) for t in spans)
    used = {t: sum(max(0.0, min(e, both_until) - max(s, start)) for s, e in spans[t])
            for t in spans}
    share = used["gold"] / (used["gold"] + used["free"])
    return [{"figure": "gold's share of handler time (weights gold 4, free 1)", "value": share,
             "unit": "share", "baseline": "weight share (target within 10 %)",
             "baseline_value": 0.8}], {"weights": {"used_s": used, "span_s": both_until - start}}


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
    # No booster consumers here: both runs get the same threads. The baseline is plain
    # FIFO: no coordinator and FIFO dispatch in the shards.
    fairness = FairnessConfig(enabled=enabled, window_s=WINDOW_S, windows=6,
                              latency_threshold_s=1.0, interval_s=0.5, max_boost_consumers=0,
                              dispatch="fair" if enabled else "fifo")
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
    fairness = FairnessConfig(enabled=enabled, interval_s=0.5,
                              dispatch="fair" if enabled else "fifo")
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-fair-"),
                        config=Config(consumers=ConsumerConfig(count=2), fairness=fairness))
    ray.get(client.submit(tiny, -1))
    with Timer() as t, ThreadPoolExecutor(8) as pool:
        ray.get(list(pool.map(lambda i: client.submit(tiny, i), range(tasks))))
    rayq.shutdown()
    return tasks / t.seconds


def intervention(scale: float) -> tuple[list[dict], dict]:
    fifo, fair = contended_run(False, scale), contended_run(True, scale)
    # Both indexes over the same windows: from two windows after the fair run's
    # intervention started (counted from each run's start), while all were backlogged.
    skip = int(((fair["intervened_after_s"] or 0.0) + 2 * WINDOW_S) // WINDOW_S)
    fair_after, fifo_after = fair["jain"][skip:], fifo["jain"][skip:]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    rows = [
        {"figure": "Jain's index, mean over backlogged windows from 2 after intervention",
         "value": mean(fair_after), "unit": "index", "baseline": "FIFO, same windows",
         "baseline_value": mean(fifo_after)},
        {"figure": "Jain's index, worst such window", "value": min(fair_after, default=0.0),
         "unit": "index", "baseline": "FIFO, same windows",
         "baseline_value": min(fifo_after, default=0.0)},
    ]
    for kind in ("heavy", "light-a", "light-b"):
        for q in ("p50", "p99"):
            field = f"wait_{q}_s"
            rows.append({"figure": f"{kind} wait {q}", "value": getattr(fair["waits"][kind], field),
                         "unit": "s", "baseline": "FIFO",
                         "baseline_value": getattr(fifo["waits"][kind], field)})
    return rows, {"jain_per_window_fair": fair["jain"], "jain_per_window_fifo": fifo["jain"],
                  "intervened_after_s": fair["intervened_after_s"], "window_s": WINDOW_S}


def overhead(tasks: int) -> tuple[list[dict], dict]:
    fifo_rate, fair_rate = tiny_throughput(False, tasks), tiny_throughput(True, tasks)
    return [{"figure": "tiny tasks with fairness on", "value": fair_rate, "unit": "tasks/s",
             "baseline": "fairness off, FIFO dispatch", "baseline_value": fifo_rate}], {}


SCENARIOS = {"burst": burst, "weights": weights_run, "intervention": intervention}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--only", default="burst,weights,intervention,overhead")
    args = parser.parse_args()
    local_ray(namespace="rayq", include_dashboard=False, log_to_driver=False)
    rows, extra = [], {"scale": args.scale}
    for name in args.only.split(","):
        part_rows, part_extra = (overhead(args.tasks) if name == "overhead"
                                 else SCENARIOS[name](args.scale))
        rows += part_rows
        extra.update(part_extra)
    report("fairness", rows, extra)


if __name__ == "__main__":
    main()
