"""How long `client.report()` takes on one running runtime: the first report (the
analytics actor starts Spark through RayDP and reads the whole event log) and the
second (Spark warm, only the events that arrived since read), at 10 000 and
1 000 000 events; beside the main tables done with pyarrow alone in the same run.

    python benchmarks/report.py [--events 10000 1000000] [--more 2000]

The events are synthetic (three tenants, two types, half enqueues and half completions
over two hours) and written straight into the runtime's event log
(``<data_dir>/events``, date/hour partitions) with its own EventLog; ``--more`` events
arrive between the two reports. Targets: a first report with Spark's start in 45 s, a
warm second report of a few thousand events in 10 s, of a million in 25 s.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

import rayq  # noqa: E402
from rayq.analytics.eventlog import EventLog, read_events  # noqa: E402
from rayq.config import AnalyticsConfig, Config, ConsumerConfig  # noqa: E402

T0 = 1_790_000_040.0
SPAN_S = 7200.0


def write_log(root: str, events: int, writer: str = "bench", seed: int = 1,
              start: float = T0) -> None:
    """``events`` events (enqueue and completion pairs) over SPAN_S from ``start``."""
    rng = random.Random(seed)
    log = EventLog(root, writer)
    span = SPAN_S / max(1, events // 2)
    for i in range(events // 2):
        at = start + i * span
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
        grouped = done.group_by(by).aggregate([("usage_s", "sum"), ("usage_s", "count")])
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


def one_size(events: int, more: int) -> list[dict]:
    """First and second report on a fresh runtime over ``events`` events."""
    data_dir = tempfile.mkdtemp(prefix="rayq-bench-report-")
    config = Config(consumers=ConsumerConfig(count=0), analytics=AnalyticsConfig(events=False))
    client = rayq.start(data_dir=data_dir, config=config, dashboard=False)
    root = os.path.join(data_dir, "events")
    try:
        with Timer() as written:
            write_log(root, events)
        with Timer() as first:
            one = client.report(os.path.join(data_dir, "report-1"))
        write_log(root, more, writer="bench-more", seed=2, start=T0 + SPAN_S)
        with Timer() as second:
            two = client.report(os.path.join(data_dir, "report-2"))
        with Timer() as arrow:
            pyarrow_only(root, AnalyticsConfig().window_s)
    finally:
        rayq.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)
    return [
        {"figure": f"first report, {one.events:,} events (starts Spark in the analytics actor)",
         "value": first.seconds, "unit": "s", "baseline": "target", "baseline_value": 45.0},
        {"figure": f"second report, {two.events:,} events (Spark warm, {more:,} new)",
         "value": second.seconds, "unit": "s", "baseline": "pyarrow alone, main tables",
         "baseline_value": arrow.seconds},
        {"figure": f"writing {events:,} events (EventLog, Parquet)",
         "value": events / written.seconds, "unit": "events/s", "baseline": "-",
         "baseline_value": None},
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--more", type=int, default=2_000, help="events between the reports")
    args = parser.parse_args()
    rows = [row for events in args.events for row in one_size(events, args.more)]
    report("report", rows, {"events": args.events, "more": args.more})


if __name__ == "__main__":
    main()
