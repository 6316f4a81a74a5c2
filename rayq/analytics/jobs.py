"""The report's aggregations as Spark DataFrames over the event log.

Every table is a pure function of the events DataFrame, so the same code runs
on a laptop-sized Spark started by RayDP and on a cluster.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from rayq.analytics.schema import TABLES

LOOKBACK_S = 1800.0      # the flood detector's default look-back (10 windows of 180 s)
SUGGEST_FACTOR = 2.0     # suggested thresholds: twice what the busiest normal user showed


def completed(events: DataFrame) -> DataFrame:
    return events.filter((F.col("kind") == "completion") & (F.col("outcome") == "succeeded"))


def windowed(df: DataFrame, window_s: float) -> DataFrame:
    """Add ``window_start`` (seconds since the epoch) for windows of ``window_s``."""
    micros = F.unix_micros(F.col("ts")).cast("double")
    return df.withColumn("window_start", F.floor(micros / (window_s * 1e6)) * window_s)


def usage_by(events: DataFrame, column: str) -> DataFrame:
    """Completions, usage and exact wait percentiles per tenant or per type."""
    return (completed(events).groupBy(column).agg(
        F.count("*").alias("completed"),
        F.sum("usage_s").alias("usage_s"),
        F.expr("percentile(wait_s, 0.5)").alias("wait_p50_s"),
        F.expr("percentile(wait_s, 0.95)").alias("wait_p95_s"),
        F.expr("percentile(wait_s, 0.99)").alias("wait_p99_s"))
        .withColumn("usage_share", F.col("usage_s") / F.sum("usage_s").over(Window.partitionBy()))
        .orderBy(column))


def usage_share_by_window(events: DataFrame, window_s: float, column: str) -> DataFrame:
    per = (windowed(completed(events), window_s).groupBy("window_start", column)
           .agg(F.sum("usage_s").alias("usage_s")))
    total = F.sum("usage_s").over(Window.partitionBy("window_start"))
    return per.withColumn("usage_share", F.col("usage_s") / total).orderBy("window_start", column)


def fairness_index_by_window(shares: DataFrame, backlogged: DataFrame) -> DataFrame:
    """Jain's index of usage among the keys that ran in each window: (Σx)² / (n Σx²),
    beside how many keys were backlogged then (the index says something about
    fairness only where two or more keys competed)."""
    index = (shares.groupBy("window_start").agg(
        (F.pow(F.sum("usage_s"), 2) / (F.count("*") * F.sum(F.col("usage_s") * F.col("usage_s"))))
        .alias("jain_index"), F.count("*").alias("keys")))
    return (index.join(backlogged, "window_start", "left")
            .withColumn("backlogged", F.coalesce(F.col("backlogged"), F.lit(0)))
            .orderBy("window_start"))


def backlogged_by_window(events: DataFrame, window_s: float, column: str) -> DataFrame:
    """How many keys had a task waiting in each window: a completed task waited from
    its enqueue (start minus wait) to its start (completion minus usage)."""
    done = completed(events).filter(F.col("wait_s") > 0)
    started = F.unix_micros(F.col("ts")).cast("double") / 1e6 - F.col("usage_s")
    first = F.floor((started - F.col("wait_s")) / window_s)
    last = F.floor(started / window_s)
    spans = done.select(column, F.explode(F.sequence(first, last)).alias("w"))
    return (spans.select(column, (F.col("w") * window_s).cast("double").alias("window_start"))
            .distinct().groupBy("window_start").agg(F.count("*").alias("backlogged")))


def wait_by_window(events: DataFrame, window_s: float, column: str) -> DataFrame:
    """Per window and key: the p50 and worst wait of the tasks that completed in it."""
    return (windowed(completed(events), window_s).groupBy("window_start", column).agg(
        F.expr("percentile(wait_s, 0.5)").alias("wait_p50_s"), F.max("wait_s").alias("wait_max_s"))
        .orderBy("window_start", column))


def summary(events: DataFrame) -> DataFrame:
    """One row: the time span, counts, and the longest wait with who had it."""
    is_completion = F.col("kind") == "completion"
    totals = events.agg(
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"), F.count("*").alias("events"),
        F.sum(F.when(is_completion & (F.col("outcome") == "succeeded"), 1).otherwise(0))
        .alias("completed"),
        F.sum(F.when(is_completion & (F.col("outcome") != "succeeded"), 1).otherwise(0))
        .alias("failed"),
        F.countDistinct("tenant").alias("tenants"), F.countDistinct("type").alias("types"))
    worst = (completed(events).orderBy(F.desc("wait_s"), "ts").limit(1)
             .select(F.col("wait_s").alias("worst_wait_s"), F.col("tenant").alias("worst_wait_tenant"),
                     F.col("type").alias("worst_wait_type"), F.col("ts").alias("worst_wait_at")))
    return totals.join(worst, how="left")


def throughput_by_window(events: DataFrame, window_s: float) -> DataFrame:
    return (windowed(completed(events), window_s).groupBy("window_start")
            .agg(F.count("*").alias("completed"))
            .withColumn("per_s", F.col("completed") / F.lit(window_s)).orderBy("window_start"))


def redeliveries(events: DataFrame) -> DataFrame:
    """Per (tenant, type): completions, failures, redeliveries, dead letters, deferrals."""
    def count_of(kind: str, outcome: str | None = None):
        cond = F.col("kind") == kind
        if outcome:
            cond = cond & (F.col("outcome") == outcome)
        return F.sum(F.when(cond, 1).otherwise(0))
    return (events.filter(F.col("kind").isin("completion", "redelivery", "dead_letter", "deferral"))
            .groupBy("tenant", "type").agg(
                count_of("completion", "succeeded").alias("completed"),
                count_of("completion", "failed").alias("failed"),
                count_of("redelivery").alias("redeliveries"),
                count_of("dead_letter").alias("dead_letters"),
                count_of("deferral").alias("deferrals"))
            .orderBy("tenant", "type"))


def flood_timeline(events: DataFrame) -> DataFrame:
    return (events.filter(F.col("kind") == "flood")
            .select("ts", "queue", "type", "tenant", F.col("outcome").alias("event"), "detail")
            .orderBy("ts"))


def intervention_timeline(events: DataFrame) -> DataFrame:
    """The fairness decisions where intervention started or stopped."""
    order = Window.orderBy("ts")
    decisions = (events.filter(F.col("kind") == "fairness").select("ts", "outcome")
                 .withColumn("before", F.lag("outcome").over(order)))
    return (decisions.filter(F.col("before").isNull() | (F.col("before") != F.col("outcome")))
            .select("ts", F.col("outcome").alias("state")).orderBy("ts"))


def suggested_thresholds(events: DataFrame, lookback_s: float = LOOKBACK_S) -> DataFrame:
    """Thresholds from what was observed, each with how it was derived."""
    wait_p99 = completed(events).agg(F.expr("percentile(wait_s, 0.99)")).first()[0] or 0.0
    enqueues = windowed(events.filter(F.col("kind") == "enqueue"), lookback_s)
    per_window = enqueues.groupBy("window_start", "type", "tenant").count()
    enqueue_p99 = per_window.agg(F.expr("percentile(count, 0.99)")).first()[0] or 0.0
    step = (F.when(F.col("kind") == "enqueue", 1)
            .when((F.col("kind") == "completion") & F.col("outcome").isin("succeeded", "dead"), -1)
            .otherwise(0))
    running = Window.partitionBy("type", "tenant").orderBy("ts", "kind_order") \
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    backlog = (events.filter(F.col("kind").isin("enqueue", "completion"))
               .withColumn("kind_order", F.when(F.col("kind") == "enqueue", 0).otherwise(1))
               .withColumn("backlog", F.sum(step).over(running))
               .groupBy("type", "tenant").agg(F.max("backlog").alias("peak")))
    peak_p99 = backlog.agg(F.expr("percentile(peak, 0.99)")).first()[0] or 0.0
    rows = [("fairness.latency_threshold_s", SUGGEST_FACTOR * wait_p99,
             "2 x the p99 wait of completed tasks"),
            ("flood.enqueue_threshold", SUGGEST_FACTOR * enqueue_p99,
             f"2 x the p99 of enqueues per (type, tenant) per {lookback_s:.0f} s"),
            ("flood.depth_threshold", SUGGEST_FACTOR * peak_p99,
             "2 x the p99 of each (type, tenant)'s peak backlog")]
    # Built in the JVM (no Python worker on the executors): literals, one row each.
    one = events.sparkSession.range(1)
    frames = [one.select(F.lit(name).alias("name"), F.lit(float(value)).alias("value"),
                         F.lit(basis).alias("basis")) for name, value, basis in rows]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def all_tables(events: DataFrame, window_s: float) -> dict[str, DataFrame]:
    """Every table of the report, by name, in the order of :data:`TABLES`."""
    shares = usage_share_by_window(events, window_s, "type")
    tables = {
        "summary": summary(events),
        "usage_by_tenant": usage_by(events, "tenant"),
        "usage_by_type": usage_by(events, "type"),
        "usage_share_by_window": shares,
        "usage_share_by_tenant_window": usage_share_by_window(events, window_s, "tenant"),
        "fairness_index_by_window": fairness_index_by_window(
            shares, backlogged_by_window(events, window_s, "type")),
        "wait_by_window": wait_by_window(events, window_s, "type"),
        "throughput_by_window": throughput_by_window(events, window_s),
        "redeliveries": redeliveries(events),
        "flood_timeline": flood_timeline(events),
        "intervention_timeline": intervention_timeline(events),
        "suggested_thresholds": suggested_thresholds(events),
    }
    return {name: tables[name] for name in TABLES}
