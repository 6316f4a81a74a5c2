"""How long the Spark report takes over a large event log, beside the same
aggregations done with pyarrow alone in the same run.

    python benchmarks/report.py [--events 1000000]

The log is synthetic (three tenants, two types, half enqueues and half
completions over two hours), written with the runtime's own EventLog.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

import pyarrow as pa
import pyarrow.compute as pc
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

from rayq.analytics.eventlog import EventLog, read_events  # noqa: E402
from rayq.analytics.report import run_report  # noqa: E402
from rayq.config import AnalyticsConfig  # noqa: E402

T0 = 1_790_000_040.0


def write_log(root: str, events: int) -> None:
    rng = random.Random(1)
    log = EventLog(root, "bench")
    span = 7200.0 / (events / 2)
    for i in range(events // 2):
        at = T0 + i * span
        tenant, type_ = rng.choice(("acme", "globex", "initech")), rng.choice(("report", "email"))
        log.append("enqueue", at, tenant=tenant, type=type_, subqueue=1, key=type_)
        log.append("completion", at + 0.5, tenant=tenant, type=type_, key=type_, outcome="succeeded",
                   usage_s=rng.uniform(0.01, 2.0), wait_s=rng.expovariate(1.0), attempt=1)
    log.flush()


def pyarrow_only(root: str, window_s: float) -> dict:
    """The report's main figures with pyarrow: per tenant, per type, per window."""
    table = read_events(root)
    done = table.filter(pc.and_(pc.equal(table["kind"], "completion"),
                                pc.equal(table["outcome"], "succeeded")))
    out = {}
    for by in ("tenant", "type"):
        grouped = done.group_by(by).aggregate([("usage_s", "sum"), ("usage_s", "count"),
                                               ("wait_s", "tdigest")])
        out[by] = grouped.num_rows
        for name in grouped[by].to_pylist():  # exact percentiles, as the Spark job computes
            waits = done.filter(pc.equal(done[by], name))["wait_s"]
            pc.quantile(waits, q=[0.5, 0.95, 0.99], interpolation="linear")
    seconds = pc.divide(pc.cast(pc.cast(done["ts"], pa.int64()), pa.float64()), 1e6)
    window = pc.multiply(pc.floor(pc.divide(seconds, window_s)), window_s)
    per = pa.table({"w": window, "type": done["type"], "u": done["usage_s"]}) \
        .group_by(["w", "type"]).aggregate([("u", "sum")])
    out["windows"] = per.group_by("w").aggregate([("u_sum", "sum")]).num_rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    root, out = tempfile.mkdtemp(prefix="rayq-events-"), tempfile.mkdtemp(prefix="rayq-report-")
    with Timer() as written:
        write_log(root, args.events)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with Timer() as spark:
        result = run_report(root, out, AnalyticsConfig())
    with Timer() as arrow:
        pyarrow_only(root, AnalyticsConfig().window_s)
    rows = [
        {"figure": f"Spark report via RayDP, {result.events:,} events (incl. start-up)",
         "value": spark.seconds, "unit": "s", "baseline": "pyarrow alone, main tables",
         "baseline_value": arrow.seconds},
        {"figure": "writing the event log (EventLog, Parquet)", "value": args.events / written.seconds,
         "unit": "events/s", "baseline": "-", "baseline_value": None},
    ]
    report("report", rows, {"events": result.events})


if __name__ == "__main__":
    main()
