"""``rayq report``: Spark started on the running Ray cluster with RayDP reads the
event log and writes Parquet tables, PNG plots and one self-contained HTML page.

Results leave Spark as Parquet files (and small tables by ``collect()``), not
through ``ray.data.from_spark``, which crashed on Ray 2.53 and 2.60 with raydp
1.6.5 ("Check failed: objects_valid").
"""

from __future__ import annotations

import base64
import html
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rayq.config import AnalyticsConfig
from rayq.errors import RayqError, RuntimeFailure

PLOTTED = ("usage_share_by_window", "usage_by_tenant", "fairness_index_by_window")


class NoEvents(RayqError):
    """Raised when the event log holds no events yet to report on."""


@dataclass(frozen=True)
class Report:
    """What ``client.report`` made: the HTML page, Parquet tables and PNG plots by name."""

    html: str
    tables: dict[str, str]
    plots: dict[str, str] = field(default_factory=dict)
    events: int = 0
    seconds: float = 0.0


def spark_session(config: AnalyticsConfig):
    """Spark on the running Ray cluster (RayDP), sized by ``config``."""
    import raydp

    return raydp.init_spark(
        app_name="rayq-report", num_executors=config.executors,
        executor_cores=config.executor_cores, executor_memory=config.executor_memory,
        # Python workers must use this interpreter (and its packages), not the system one.
        configs={"spark.pyspark.python": sys.executable,
                 "spark.pyspark.driver.python": sys.executable,
                 "spark.driver.memory": config.driver_memory,
                 "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
                 "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false"})


def run_report(events_dir: str, out_dir: str, config: AnalyticsConfig,
               progress: Callable[[str], None] = lambda step: None) -> Report:
    """Compute every table with Spark, then plot and render the page."""
    import raydp

    from rayq.analytics import jobs
    from rayq.analytics.eventlog import event_files

    if not event_files(events_dir):
        raise NoEvents(f"no events under {events_dir!r} yet")
    started = time.monotonic()
    progress("starting Spark on Ray (RayDP)")
    spark = spark_session(config)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        events = spark.read.parquet(events_dir)
        count = events.count()
        tables, small = {}, {}
        for name, frame in jobs.all_tables(events, config.window_s).items():
            progress(f"computing {name}")
            path = os.path.join(out_dir, "tables", name)
            frame.coalesce(1).write.mode("overwrite").parquet(path)
            tables[name] = path
            if name in PLOTTED or frame.count() <= 200:
                small[name] = [row.asDict() for row in spark.read.parquet(path).collect()]
    except Exception as err:
        if isinstance(err, RayqError):
            raise
        raise RuntimeFailure(f"the Spark report failed: {err}") from err
    finally:
        raydp.stop_spark()
    progress("plotting")
    plots = make_plots(small, out_dir)
    page = write_html(small, plots, out_dir, count)
    return Report(page, tables, plots, count, time.monotonic() - started)


# -- plots and the page ---------------------------------------------------------------
def make_plots(small: dict[str, list[dict]], out_dir: str) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    plots = {}
    for name, draw in (("usage_share", _usage_share), ("waits", _waits),
                       ("fairness_index", _fairness_index)):
        fig, ax = plt.subplots(figsize=(8, 3.6))
        draw(ax, small)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        plots[name] = path
    return plots


def _usage_share(ax, small) -> None:
    rows = small.get("usage_share_by_window", [])
    types = sorted({r["type"] for r in rows})
    starts = sorted({r["window_start"] for r in rows})
    share = {(r["window_start"], r["type"]): r["usage_share"] for r in rows}
    t0 = starts[0] if starts else 0.0
    xs = [(s - t0) / 60 for s in starts]
    if xs:
        ax.stackplot(xs, [[share.get((s, t), 0.0) for s in starts] for t in types], labels=types)
        ax.legend(loc="upper right", fontsize=8)
    ax.set(title="usage share by job type", xlabel="minutes", ylabel="share of thread time")


def _waits(ax, small) -> None:
    rows = small.get("usage_by_tenant", [])
    names = [r["tenant"] for r in rows]
    for i, q in enumerate(("p50", "p95", "p99")):
        ax.bar([x + i * 0.27 for x in range(len(names))], [r[f"wait_{q}_s"] for r in rows],
               width=0.27, label=q)
    ax.set_xticks([x + 0.27 for x in range(len(names))], names)
    ax.set(title="wait before running, by tenant", ylabel="seconds")
    ax.legend(fontsize=8)


def _fairness_index(ax, small) -> None:
    rows = small.get("fairness_index_by_window", [])
    t0 = rows[0]["window_start"] if rows else 0.0
    ax.plot([(r["window_start"] - t0) / 60 for r in rows], [r["jain_index"] for r in rows],
            marker="o")
    ax.set(title="Jain's fairness index of usage by job type", xlabel="minutes", ylim=(0, 1.05))


def write_html(small: dict[str, list[dict]], plots: dict[str, str], out_dir: str,
               events: int) -> str:
    parts = [f"<h1>rayq report</h1><p>{events:,} events.</p>"]
    for name, path in plots.items():
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        parts.append(f'<h2>{html.escape(name)}</h2><img src="data:image/png;base64,{data}">')
    for name, rows in small.items():
        parts.append(f"<h2>{html.escape(name)}</h2>" + _table(rows))
    page = ("<!doctype html><meta charset='utf-8'><title>rayq report</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}</style>"
            + "".join(parts))
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def _table(rows: list[dict]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in r.values())
                   + "</tr>" for r in rows[:200])
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
