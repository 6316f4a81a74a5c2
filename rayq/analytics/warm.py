"""A Spark session kept between reports, with the events read so far held in Spark.

A report adds the events that arrived since the last one: its ``gather(known)``
(:mod:`rayq.analytics.sources`) reads the event files not in ``known``, where they
lie, and hands them over as Arrow tables in Ray's object store; RayDP turns those
into a DataFrame (``ray_dataset_to_spark_dataframe``: its executors fetch the
tables from the object store, so no Spark process opens an event file). They are
added to the events already held, and the result is kept in Spark's block store (a
local checkpoint: no lineage back to the tables), so every table of the report, and
every later report, scans memory. When a file read earlier has gone, everything is
read again.

RayDP starts Spark once per process: a ``WarmSpark`` that was stopped cannot start
again (the analytics actor then exits and the next report starts a fresh one).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from rayq.analytics import page
from rayq.analytics.report import Report, spark_log_config, spark_session
from rayq.analytics.schema import EVENT_SCHEMA, FIELDS
from rayq.analytics.sources import NewEvents, local_events
from rayq.config import AnalyticsConfig
from rayq.errors import NoEvents, RayqError, RuntimeFailure

PLOTTED = ("usage_share_by_window", "wait_by_window", "fairness_index_by_window")
SMALL_ROWS = 200  # tables up to this size are shown on the page
JOBS_IN_FLIGHT = 2  # Spark jobs collected at once
EVENTS_PER_PARTITION = 250_000  # held events per Spark partition (a task's share)
# Whole-stage code generation compiles each query first: on a few thousand events the
# compiling costs more than the running saves; on many, it pays.
CODEGEN_FROM_EVENTS = 200_000


class WarmSpark:
    """Spark on Ray (RayDP) sized by ``config``, started by the first :meth:`report`."""

    def __init__(self, config: AnalyticsConfig):
        self.config = config
        self.log: str | None = None    # Spark's log file, once started
        self.stopped = False
        self._spark = None
        self._events = None            # every event read so far, checkpointed in Spark
        self._files: frozenset[str] = frozenset()  # the event files those came from
        self._count = 0
        self.reports = 0

    @property
    def running(self) -> bool:
        return self._spark is not None

    @property
    def held(self) -> int:
        """How many events Spark holds (read by earlier reports)."""
        return self._count

    def report(self, gather: Callable[[frozenset[str]], NewEvents], out_dir: str,
               window_s: float, progress: Callable[[str], None] = lambda step: None,
               current: Mapping[str, float] | None = None, log_dir: str | None = None):
        """Compute every table of the events held plus those ``gather(files read so far)``
        brings into ``out_dir``, plot them and write the page; returns a
        :class:`rayq.analytics.report.Report`. ``log_dir``: where Spark logs, if this
        report starts it (default ``out_dir``). Raises NoEvents when there are none,
        RuntimeFailure when Spark fails."""
        new = gather(self._files)
        if not new.files:
            raise NoEvents("no events written yet")
        started = time.monotonic()
        try:
            self._start(log_dir or out_dir, progress)
            events, count = self._refresh(new)
            self._spark.conf.set("spark.sql.codegen.wholeStage",
                                 "true" if count >= CODEGEN_FROM_EVENTS else "false")
            tables, small = self._tables(events, window_s, out_dir, progress)
        except Exception as err:
            if isinstance(err, RayqError):
                raise
            raise RuntimeFailure(f"the Spark report failed: {_first_line(err)} "
                                 f"(Spark's log: {self.log})") from err
        progress("plotting")
        periods = page.periods(small)
        plots = page.make_plots(small, out_dir, periods)
        progress("writing the page")
        html = page.write_html(small, plots, out_dir, count, periods, current)
        self.reports += 1
        return Report(html, tables, plots, count, time.monotonic() - started, new.reads)

    def start(self, log_dir: str) -> None:
        """Start Spark now (a report would start it anyway), logging under ``log_dir``."""
        self._start(log_dir, lambda step: None)

    def stop(self) -> None:
        """Stop Spark (its executors leave the cluster); this object cannot start again."""
        if self._spark is not None:
            import raydp

            self._events = None
            self._spark = None
            raydp.stop_spark()
        self.stopped = True

    # -- steps ------------------------------------------------------------------------
    def _start(self, log_dir: str, progress: Callable[[str], None]) -> None:
        if self._spark is not None:
            progress("Spark is warm")
            return
        if self.stopped:
            raise RuntimeFailure("this process's Spark was stopped; RayDP cannot start it again")
        progress("starting Spark on Ray (RayDP)")
        log_config, self.log = spark_log_config(log_dir)
        self._spark = spark_session(self.config, log_config)

    def _refresh(self, new: NewEvents):
        """The events held, with ``new`` added; (DataFrame, count)."""
        if new.again:  # a file read earlier has gone: ``new`` holds every file's events
            self._events, self._count = None, 0
        if new.blocks:
            fresh = self._dataframe(new.blocks)
            held = fresh if self._events is None else self._events.unionByName(fresh)
            self._count += new.events
            # Kept in Spark's block store, cut from the tables: one scan serves every table.
            parts = _partitions(self._count, self.config.shuffle_partitions)
            self._events = held.coalesce(parts).localCheckpoint(eager=True)
            # The copy it replaces is no longer reachable: a JVM collection lets Spark's
            # cleaner free its blocks now rather than at its next periodic one.
            self._spark.sparkContext._jvm.System.gc()
        self._files = new.files
        return self._events, self._count

    def _dataframe(self, blocks):
        """Arrow tables (or object refs of them) in Ray's object store as one DataFrame,
        through RayDP: each executor fetches its tables from the object store."""
        import ray
        from raydp.spark.dataset import ray_dataset_to_spark_dataframe

        refs = [block if isinstance(block, ray.ObjectRef) else ray.put(block) for block in blocks]
        return ray_dataset_to_spark_dataframe(self._spark, EVENT_SCHEMA, refs).select(*FIELDS)

    def _tables(self, events, window_s: float, out_dir: str, progress: Callable[[str], None]):
        """Every table, collected as Arrow (the tables are aggregates: windows, tenants,
        types) and written as Parquet by this process; the small and plotted ones are
        kept for the page. Returns (paths, small tables)."""
        from rayq.analytics import jobs

        frames = jobs.all_tables(events, window_s)
        # Several jobs in flight: one's planning and scheduling overlap another's tasks.
        with ThreadPoolExecutor(JOBS_IN_FLIGHT) as pool:
            collected = pool.map(_collect, frames.values())
            tables, small = {}, {}
            for name, table in zip(frames, collected):
                progress(f"computing {name}")
                tables[name] = _write_table(table, os.path.join(out_dir, "tables", name))
                if name in PLOTTED or table.num_rows <= SMALL_ROWS:
                    small[name] = table.to_pylist()
        return tables, small


def _first_line(err: Exception) -> str:
    """What went wrong, in one line: the last that is not a stack frame (a Python error
    raised in an executor says so last, after its traceback)."""
    lines = [line.strip() for line in str(err).splitlines()
             if line.strip() and not line.strip().startswith(("at ", "...", "File "))]
    return f"{type(err).__name__}: {(lines[-1] if lines else '')[:300]}"


def _collect(frame) -> pa.Table:
    """A DataFrame's rows as an Arrow table (times as UTC instants)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(frame.schema)
    return pa.Table.from_batches(frame._collect_as_arrow(), schema=schema)


def _write_table(table: pa.Table, folder: str) -> str:
    """``table`` as ``folder``/part-0.parquet, replacing what was there; returns ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tmp = os.path.join(folder, ".part-0.parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, os.path.join(folder, "part-0.parquet"))
    return folder


def _partitions(events: int, most: int) -> int:
    """Partitions to hold ``events`` in: one per EVENTS_PER_PARTITION, 1 to ``most``."""
    return max(1, min(most, -(-events // EVENTS_PER_PARTITION)))


def run_report(events_dir: str, out_dir: str, config: AnalyticsConfig,
               progress: Callable[[str], None] = lambda step: None,
               current: Mapping[str, float] | None = None) -> Report:
    """One report over the events under ``events_dir`` (a folder of this machine, or a
    URI), read by this process, in a Spark of this process's own, stopped afterwards
    (the runtime's reports go to the analytics actor, whose Spark stays warm:
    ``client.report``). ``current``: the thresholds in force, by setting name, shown
    beside the suggested ones. Raises NoEvents, or RuntimeFailure when Spark fails."""
    spark = WarmSpark(config)
    try:
        return spark.report(lambda known: local_events(events_dir, known), out_dir,
                            config.window_s, progress, current)
    finally:
        spark.stop()
