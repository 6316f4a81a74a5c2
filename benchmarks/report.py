"""How long `client.report()` takes on one running runtime, beside pyarrow alone
computing the same tables from the raw events in the same run.

    python benchmarks/report.py [--events 10000 1000000 10000000] [--more 2000]

For each size: the first report (the analytics actor starts Spark through RayDP and
folds the whole event log into its aggregates, slice by slice) and the second (Spark
warm: only the ``--more`` events that arrived since are read and merged); pyarrow alone
reads every event each time (it keeps nothing), and its peak memory is printed. The
events are synthetic (three tenants, two types, half enqueues and half completions over
two hours), written as Parquet files of a million events into the runtime's event log
(``<data_dir>/events``, date/hour partitions). Targets on a 2-core machine: at 1 000 000
events a first report in 30 s and a second in 5 s; at 10 000 000, a first report that
completes within the machine's memory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import uuid

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

import rayq  # noqa: E402
from rayq.analytics import reference  # noqa: E402
from rayq.analytics.eventlog import read_events  # noqa: E402
from rayq.analytics.schema import EVENT_SCHEMA, SCHEMA_VERSION  # noqa: E402
from rayq.config import AnalyticsConfig, Config, ConsumerConfig  # noqa: E402

T0 = 1_790_000_040.0
SPAN_S = 7200.0
FILE_EVENTS = 1_000_000


def write_log(root: str, events: int, writer: str = "bench", seed: int = 1,
              start: float = T0) -> None:
    """``events`` events (enqueue and completion pairs) spread over SPAN_S from
    ``start``, in files of up to FILE_EVENTS, each under its hour's partition."""
    rng = np.random.default_rng(seed)
    pairs = events // 2
    step = SPAN_S / max(1, pairs)
    for lo in range(0, pairs, FILE_EVENTS // 2):
        n = min(FILE_EVENTS // 2, pairs - lo)
        at = start + (lo + np.arange(n)) * step
        tenant = np.array(["acme", "globex", "initech"])[rng.integers(0, 3, n)]
        type_ = np.array(["report", "email"])[rng.integers(0, 2, n)]
        table = pa.table({
            "ts": pa.array(np.concatenate([at, at + 0.5]) * 1e6, pa.int64()).cast(EVENT_SCHEMA.field("ts").type),
            "kind": np.repeat(["enqueue", "completion"], n),
            "subqueue": pa.array(np.concatenate([np.ones(n, np.int64), np.zeros(n, np.int64)])),
            "tenant": np.concatenate([tenant, tenant]), "type": np.concatenate([type_, type_]),
            "key": np.concatenate([type_, type_]),
            "usage_s": pa.array(np.concatenate([np.full(n, np.nan), rng.uniform(0.01, 2.0, n)]),
                                from_pandas=True),
            "wait_s": pa.array(np.concatenate([np.full(n, np.nan), rng.exponential(1.0, n)]),
                               from_pandas=True),
            "outcome": pa.array([None] * n + ["succeeded"] * n, pa.string()),
            "attempt": pa.array([None] * n + [1] * n, pa.int32()),
        })
        hour = dt.datetime.fromtimestamp(float(at[0]), dt.timezone.utc)
        folder = os.path.join(root, hour.strftime("date=%Y-%m-%d/hour=%H"))
        os.makedirs(folder, exist_ok=True)
        full = pa.table([table[f.name] if f.name in table.column_names else
                         (pa.array([SCHEMA_VERSION] * table.num_rows, f.type)
                          if f.name == "schema_version" else pa.nulls(table.num_rows, f.type))
                         for f in EVENT_SCHEMA], schema=EVENT_SCHEMA)
        pq.write_table(full, os.path.join(folder, f"part-{writer}-{uuid.uuid4().hex[:12]}.parquet"))


def pyarrow_alone(root: str, window_s: float) -> tuple[float, int]:
    """Seconds to read every event and compute the report's main tables exactly, and
    the process's peak resident memory growth in bytes."""
    before = psutil.Process().memory_info().rss
    with Timer() as timed:
        reference.main_tables(read_events(root), window_s)
    return timed.seconds, max(0, psutil.Process().memory_info().rss - before)


def one_size(events: int, more: int) -> list[dict]:
    """First and second report on a fresh runtime over ``events`` events."""
    data_dir = tempfile.mkdtemp(prefix="rayq-bench-report-")
    config = Config(consumers=ConsumerConfig(count=0), analytics=AnalyticsConfig(events=False))
    client = rayq.start(data_dir=data_dir, config=config, dashboard=False)
    root = os.path.join(data_dir, "events")
    window_s = AnalyticsConfig().window_s
    try:
        write_log(root, events)
        with Timer() as first:
            one = client.report(os.path.join(data_dir, "report-1"))
        arrow_first, memory = pyarrow_alone(root, window_s)
        write_log(root, more, writer="bench-more", seed=2, start=T0 + SPAN_S)
        with Timer() as second:
            two = client.report(os.path.join(data_dir, "report-2"))
        arrow_second, _ = pyarrow_alone(root, window_s)
    finally:
        rayq.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)
    return [
        {"figure": f"first report, {one.events:,} events (starts Spark in the analytics actor)",
         "value": first.seconds, "unit": "s", "baseline": "pyarrow alone, same tables",
         "baseline_value": arrow_first},
        {"figure": f"second report, {two.events:,} events (Spark warm, {more:,} new)",
         "value": second.seconds, "unit": "s", "baseline": "pyarrow alone, same tables",
         "baseline_value": arrow_second},
        {"figure": f"pyarrow alone's memory at {events:,} events", "value": memory / 2**20,
         "unit": "MiB", "baseline": "-", "baseline_value": None},
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 1_000_000, 10_000_000])
    parser.add_argument("--more", type=int, default=2_000, help="events between the reports")
    args = parser.parse_args()
    rows = [row for events in args.events for row in one_size(events, args.more)]
    report("report", rows, {"events": args.events, "more": args.more})


if __name__ == "__main__":
    main()
