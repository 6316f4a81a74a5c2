"""The report's main tables computed exactly from raw events with pyarrow alone, in one
process: the yardstick the Spark report is checked and timed against (tests,
``benchmarks/report.py``). Percentiles here are exact (linear interpolation); the
report's come from sketches, within :func:`rayq.analytics.cells.rank_error` in rank.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rayq.analytics.cells import LOOKBACK_S, window_of

QUANTILES = (0.5, 0.95, 0.99)


def succeeded(events: pa.Table) -> pa.Table:
    return events.filter(pc.and_(pc.equal(events["kind"], "completion"),
                                 pc.equal(events["outcome"], "succeeded")))


def usage_by(events: pa.Table, column: str) -> dict[str, dict]:
    """Per tenant or type: completed, usage_s, and the exact wait quantiles."""
    done = succeeded(events)
    out = {}
    for row in done.group_by(column).aggregate([("usage_s", "sum"), ("usage_s", "count")]
                                               ).to_pylist():
        waits = done.filter(pc.equal(done[column], row[column]))["wait_s"]
        out[row[column]] = {"completed": row["usage_s_count"], "usage_s": row["usage_s_sum"],
                            "waits": pc.quantile(waits, q=list(QUANTILES),
                                                 interpolation="linear").to_pylist()}
    return out


def usage_by_window(events: pa.Table, window_s: float) -> dict[tuple, float]:
    """(window_start, type): usage of the tasks that completed in it."""
    done = succeeded(events)
    per = pa.table({"w": window_of(done["ts"], window_s), "type": done["type"],
                    "u": done["usage_s"]}).group_by(["w", "type"]).aggregate([("u", "sum")])
    return {(r["w"], r["type"]): r["u_sum"] for r in per.to_pylist()}


def enqueue_p99(events: pa.Table) -> float:
    """The p99 of enqueues per (look-back window, type, tenant)."""
    enq = events.filter(pc.equal(events["kind"], "enqueue"))
    per = pa.table({"w": window_of(enq["ts"], LOOKBACK_S), "type": enq["type"],
                    "tenant": enq["tenant"], "n": pa.array(np.ones(enq.num_rows))}) \
        .group_by(["w", "type", "tenant"]).aggregate([("n", "sum")])
    return pc.quantile(per["n_sum"], q=0.99).to_pylist()[0] if per.num_rows else 0.0


def peak_p99(events: pa.Table, window_s: float) -> float:
    """The p99 of each (type, tenant)'s largest backlog at a window's end (0 at least)."""
    kind, outcome = events["kind"], events["outcome"]
    step = pc.if_else(pc.equal(kind, "enqueue"), 1,
                      pc.if_else(pc.and_(pc.equal(kind, "completion"),
                                         pc.is_in(outcome, pa.array(["succeeded", "dead"]))), -1, 0))
    moved = pc.is_in(kind, pa.array(["enqueue", "completion"]))
    rows = pa.table({"type": events["type"], "tenant": events["tenant"],
                     "w": window_of(events["ts"], window_s), "step": step}).filter(moved)
    net = rows.group_by(["type", "tenant", "w"]).aggregate([("step", "sum")]) \
        .sort_by([("type", "ascending"), ("tenant", "ascending"), ("w", "ascending")])
    peaks: dict[tuple, int] = {}
    level: dict[tuple, int] = {}
    for r in net.to_pylist():
        who = (r["type"], r["tenant"])
        level[who] = level.get(who, 0) + r["step_sum"]
        peaks[who] = max(peaks.get(who, 0), level[who])
    return pc.quantile(pa.array(list(peaks.values()), pa.float64()), q=0.99).to_pylist()[0] \
        if peaks else 0.0


def main_tables(events: pa.Table, window_s: float) -> dict:
    """Usage and exact wait quantiles per tenant and type, usage per window and type,
    and the three suggested thresholds' inputs."""
    done = succeeded(events)
    return {"usage_by_tenant": usage_by(events, "tenant"),
            "usage_by_type": usage_by(events, "type"),
            "usage_by_window": usage_by_window(events, window_s),
            "wait_p99": pc.quantile(done["wait_s"], q=0.99).to_pylist()[0] if done.num_rows else 0.0,
            "enqueue_p99": enqueue_p99(events),
            "peak_p99": peak_p99(events, window_s)}


def within_rank(value: float, values, q: float, error: float) -> bool:
    """Whether ``value`` answers quantile ``q`` of ``values`` within rank ``error``: the
    fraction of values below it is at most q + error, and at or below it at least q - error."""
    values = np.asarray(values, np.float64)
    below, at_most = np.mean(values < value), np.mean(values <= value)
    return below - error <= q <= at_most + error
