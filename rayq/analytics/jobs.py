"""The report's tables as Spark DataFrames, made from aggregates kept between reports.

A report's new events arrive aggregated where they were read
(rayq.analytics.sources.aggregate_event_files): their cells (rayq.analytics.cells:
counts, usage, tasks waiting and wait sketches per window, look-back window, tenant
and type) and the few fairness and flood events as rows. They fold into
:class:`Held` (``fold``), the cells merged with those held. Every
table is then a function of what is held (``all_tables``), so a report reads each event
once, and a warm report only the new ones. Spark runs the cells' pyarrow functions on
its executors (``mapInArrow``); the same code runs on a laptop-sized Spark started by
RayDP and on a cluster.

Figures from sketches (the wait percentiles) are within the sketches' rank error
(:func:`rayq.analytics.cells.rank_error`); every count and sum is exact. The peak
backlog behind the suggested depth threshold is read at each window's end, as the
flood detector reads depths at its intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from rayq.analytics.cells import (CELL_DDL, KEYS, LOOKBACK_S, NO_NAME, merge_batches,
                                  rollup_batches)
from rayq.analytics.schema import TABLES

SUGGEST_FACTOR = 2.0     # suggested thresholds: twice what the busiest normal user showed
WAITS = {"wait_p50_s": 0.5, "wait_p95_s": 0.95, "wait_p99_s": 0.99}


@dataclass(frozen=True)
class Held:
    """What the reports so far have read, checkpointed in Spark: ``cells`` (CELL_DDL)
    and how many there are, ``timeline`` (fairness and flood events) and how many
    ``events`` went into them."""

    cells: DataFrame
    timeline: DataFrame
    events: int
    cells_held: int


def fold(held: Held | None, cells: DataFrame, timeline: DataFrame, count: int,
         partitions: int) -> Held:
    """``held`` (None: nothing yet) with the ``cells`` and ``timeline`` rows of ``count``
    more events added."""
    if held is not None:
        cells, timeline = held.cells.unionByName(cells), held.timeline.unionByName(timeline)
    # Kept in Spark's block store, cut from the blocks they came from: those can go.
    merged = cells.repartition(partitions, *KEYS).mapInArrow(merge_batches, CELL_DDL) \
        .localCheckpoint(eager=True)
    return Held(merged, timeline.coalesce(1).localCheckpoint(eager=True),
                (held.events if held else 0) + count, merged.count())


# -- tables ----------------------------------------------------------------------------
def named(column: str):
    """A key column with a missing name shown as None."""
    return F.when(F.col(column) == NO_NAME, None).otherwise(F.col(column)).alias(column)


def finished(cells: DataFrame) -> DataFrame:
    """The cells in which a task completed."""
    return cells.filter(F.col("completed") > 0)


def rollup(cells: DataFrame, keys: list[str], partitions: int, sums: tuple = (),
           maxes: dict | None = None, quantiles: dict | None = None) -> DataFrame:
    """:func:`rayq.analytics.cells.rollup` on Spark: per ``keys``, ``sums`` summed,
    ``maxes`` at their largest, and wait ``quantiles`` from the sketches merged."""
    from pyspark.sql.pandas.types import to_arrow_schema

    maxes, quantiles = dict(maxes or {}), dict(quantiles or {})
    source = cells.select(*keys, *sums, *set(maxes.values()), "wait_sketch")
    types = {f.name: f.dataType.simpleString() for f in source.schema}
    ddl = ", ".join([f"{c} {types[c]}" for c in (*keys, *sums)]
                    + [f"{name} double" for name in (*maxes, *quantiles)])
    grouped = source.repartition(partitions, *keys) if keys else source.coalesce(1)
    return grouped.mapInArrow(partial(rollup_batches, schema=to_arrow_schema(source.schema),
                                      keys=keys, sums=sums, maxes=maxes,
                                      quantiles=quantiles), ddl)


def summary(cells: DataFrame) -> DataFrame:
    """One row: the time span, counts, and the longest wait with who had it."""
    def distinct(column):
        return F.countDistinct(F.when(F.col(column) != NO_NAME, F.col(column)))
    totals = cells.agg(
        F.min("first_ts").alias("first_ts"), F.max("last_ts").alias("last_ts"),
        F.sum("events").alias("events"), F.sum("completed").alias("completed"),
        (F.sum("completions") - F.sum("completed")).alias("failed"),
        distinct("tenant").alias("tenants"), distinct("type").alias("types"))
    worst = (finished(cells).orderBy(F.desc("wait_max"), "worst_at").limit(1)
             .select(F.col("wait_max").alias("worst_wait_s"),
                     named("tenant").alias("worst_wait_tenant"),
                     named("type").alias("worst_wait_type"), F.col("worst_at").alias("worst_wait_at")))
    return totals.join(worst, how="left")


def usage_by(cells: DataFrame, column: str, partitions: int) -> DataFrame:
    """Completions, usage and wait percentiles per tenant or per type."""
    rolled = rollup(finished(cells), [column], partitions, ("completed", "usage_s"),
                    quantiles=WAITS)
    return (rolled.withColumn("usage_share", F.col("usage_s") / F.sum("usage_s").over(
        Window.partitionBy()))
        .select(named(column), "completed", "usage_s", *WAITS, "usage_share").orderBy(column))


def usage_share_by_window(cells: DataFrame, column: str) -> DataFrame:
    per = finished(cells).groupBy("window_start", column).agg(F.sum("usage_s").alias("usage_s"))
    total = F.sum("usage_s").over(Window.partitionBy("window_start"))
    return (per.withColumn("usage_share", F.col("usage_s") / total)
            .select("window_start", named(column), "usage_s", "usage_share")
            .orderBy("window_start", column))


def fairness_index_by_window(shares: DataFrame, cells: DataFrame) -> DataFrame:
    """Jain's index of usage among the keys that ran in each window: (Σx)² / (n Σx²),
    beside how many keys were backlogged then (the index says something about
    fairness only where two or more keys competed)."""
    index = (shares.groupBy("window_start").agg(
        (F.pow(F.sum("usage_s"), 2) / (F.count("*") * F.sum(F.col("usage_s") * F.col("usage_s"))))
        .alias("jain_index"), F.count("*").alias("keys")))
    waiting = (cells.filter(F.col("waiting") > 0).select("window_start", "type").distinct()
               .groupBy("window_start").agg(F.count("*").alias("backlogged")))
    return (index.join(waiting, "window_start", "left")
            .withColumn("backlogged", F.coalesce(F.col("backlogged"), F.lit(0)))
            .orderBy("window_start"))


def wait_by_window(cells: DataFrame, partitions: int) -> DataFrame:
    """Per window and type: the p50 and worst wait of the tasks that completed in it."""
    rolled = rollup(finished(cells), ["window_start", "type"], partitions,
                    maxes={"wait_max_s": "wait_max"}, quantiles={"wait_p50_s": 0.5})
    return rolled.select("window_start", named("type"), "wait_p50_s", "wait_max_s") \
        .orderBy("window_start", "type")


def throughput_by_window(cells: DataFrame, window_s: float) -> DataFrame:
    return (finished(cells).groupBy("window_start").agg(F.sum("completed").alias("completed"))
            .withColumn("per_s", F.col("completed") / F.lit(window_s)).orderBy("window_start"))


def redeliveries(cells: DataFrame) -> DataFrame:
    """Per (tenant, type): completions, failures, redeliveries, dead letters, deferrals."""
    counted = ("completed", "failed", "redeliveries", "dead_letters", "deferrals")
    seen = F.col("completions") + F.col("redeliveries") + F.col("dead_letters") + F.col("deferrals")
    return (cells.filter(seen > 0).groupBy("tenant", "type")
            .agg(*(F.sum(c).alias(c) for c in counted))
            .select(named("tenant"), named("type"), *counted).orderBy("tenant", "type"))


def flood_timeline(timeline: DataFrame) -> DataFrame:
    return (timeline.filter(F.col("kind") == "flood")
            .select("ts", "queue", "type", "tenant", F.col("outcome").alias("event"), "detail")
            .orderBy("ts"))


def intervention_timeline(timeline: DataFrame) -> DataFrame:
    """The fairness decisions where intervention started or stopped."""
    order = Window.orderBy("ts")
    decisions = (timeline.filter(F.col("kind") == "fairness").select("ts", "outcome")
                 .withColumn("before", F.lag("outcome").over(order)))
    return (decisions.filter(F.col("before").isNull() | (F.col("before") != F.col("outcome")))
            .select("ts", F.col("outcome").alias("state")).orderBy("ts"))


def peak_backlogs(cells: DataFrame) -> DataFrame:
    """Per (type, tenant): the largest backlog (enqueued minus succeeded or dead) at
    any window's end, 0 at least."""
    steps = (cells.filter((F.col("enqueues") > 0) | (F.col("completions") > 0))
             .groupBy("type", "tenant", "window_start")
             .agg(F.sum(F.col("enqueues") - F.col("gone")).alias("net")))
    running = Window.partitionBy("type", "tenant").orderBy("window_start") \
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (steps.withColumn("backlog", F.sum("net").over(running))
            .groupBy("type", "tenant").agg(F.greatest(F.max("backlog"), F.lit(0)).alias("peak")))


def suggested_thresholds(cells: DataFrame, partitions: int) -> DataFrame:
    """Thresholds from what was observed, each with how it was derived (0 where
    nothing was): one Spark job, collected with the other tables."""
    wait_p99 = rollup(finished(cells), [], partitions, quantiles={"value": 0.99})
    per_window = (cells.filter(F.col("enqueues") > 0)
                  .groupBy("lookback_start", "type", "tenant").agg(F.sum("enqueues").alias("n")))
    enqueue_p99 = per_window.agg(F.expr("percentile(n, 0.99)").alias("value"))
    peak_p99 = peak_backlogs(cells).agg(F.expr("percentile(peak, 0.99)").alias("value"))
    one = cells.sparkSession.range(1)
    rows = [(wait_p99, "fairness.latency_threshold_s", "2 x the p99 wait of completed tasks"),
            (enqueue_p99, "flood.enqueue_threshold",
             f"2 x the p99 of enqueues per (type, tenant) per {LOOKBACK_S:.0f} s"),
            (peak_p99, "flood.depth_threshold",
             "2 x the p99 of each (type, tenant)'s peak backlog at a window's end")]
    frames = [one.join(value, how="left").select(
        F.lit(name).alias("name"),
        (F.lit(SUGGEST_FACTOR) * F.coalesce(F.col("value").cast("double"), F.lit(0.0))).alias("value"),
        F.lit(basis).alias("basis")) for value, name, basis in rows]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def all_tables(held: Held, window_s: float, partitions: int) -> dict[str, DataFrame]:
    """Every table of the report, by name, in the order of :data:`TABLES`."""
    cells = held.cells
    shares = usage_share_by_window(cells, "type")
    tables = {
        "summary": summary(cells),
        "usage_by_tenant": usage_by(cells, "tenant", partitions),
        "usage_by_type": usage_by(cells, "type", partitions),
        "usage_share_by_window": shares,
        "usage_share_by_tenant_window": usage_share_by_window(cells, "tenant"),
        "fairness_index_by_window": fairness_index_by_window(shares, cells),
        "wait_by_window": wait_by_window(cells, partitions),
        "throughput_by_window": throughput_by_window(cells, window_s),
        "redeliveries": redeliveries(cells),
        "flood_timeline": flood_timeline(held.timeline),
        "intervention_timeline": intervention_timeline(held.timeline),
        "suggested_thresholds": suggested_thresholds(cells, partitions),
    }
    return {name: tables[name] for name in TABLES}
