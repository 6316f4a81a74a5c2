"""A Spark session kept between reports, with the report's aggregates held in Spark.

A report adds the events that arrived since the last one: its ``gather(known,
window_s)`` (:mod:`rayq.analytics.sources`) reads the event files not in ``known``
where they lie and aggregates them there, one file at a time, into cells (counts,
usage and mergeable wait sketches per window, tenant and type:
:mod:`rayq.analytics.cells`) and the few fairness and flood events. Those come as Arrow
tables in Ray's object store; RayDP turns them into DataFrames
(``ray_dataset_to_spark_dataframe``: its executors fetch the tables from the object
store, so no Spark process opens an event file), and Spark merges them into the
aggregates held (:func:`rayq.analytics.jobs.fold`, kept in Spark's block store) and
computes every table from those. So a report never holds the raw log, and a warm
report reads only the new files. When a file read earlier has gone, or the report's
window changed, everything is read again.

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
from rayq.analytics.cells import CELL_SCHEMA, TIMELINE_SCHEMA
from rayq.analytics.sources import NewEvents, local_events
from rayq.config import AnalyticsConfig
from rayq.errors import NoEvents, RayqError, RuntimeFailure

PLOTTED = ("usage_share_by_window", "wait_by_window", "fairness_index_by_window")
SMALL_ROWS = 200  # tables up to this size are shown on the page
# Spark jobs collected at once: the tables' jobs are small, mostly the driver's
# planning and scheduling, which overlap (2 at once: 2.9 s for every table; 12: 2.0 s).
JOBS_IN_FLIGHT = 8
# Cells one Spark partition holds (a task's share of a fold or a table): cells grow
# with the time covered and the tenants and types seen, not with the events.
CELLS_PER_PARTITION = 200_000


class WarmSpark:
    """Spark on Ray (RayDP) sized by ``config``, started by the first :meth:`report`."""

    def __init__(self, config: AnalyticsConfig):
        self.config = config
        self.log: str | None = None    # Spark's log file, once started
        self.stopped = False
        self._spark = None
        self._held = None              # rayq.analytics.jobs.Held: the aggregates so far
        self._files: frozenset[str] = frozenset()  # the event files they came from
        self._window_s: float | None = None
        self.reports = 0

    @property
    def running(self) -> bool:
        return self._spark is not None

    @property
    def held(self) -> int:
        """How many events Spark holds (read by earlier reports)."""
        return self._held.events if self._held else 0

    def report(self, gather: Callable[[frozenset[str], float], NewEvents], out_dir: str,
               window_s: float, progress: Callable[[str], None] = lambda step: None,
               current: Mapping[str, float] | None = None, log_dir: str | None = None):
        """Compute every table of the events held plus those ``gather(files read so far,
        window_s)`` brings into ``out_dir``, plot them and write the page; returns a
        :class:`rayq.analytics.report.Report`. ``log_dir``: where Spark logs, if this
        report starts it (default ``out_dir``). Raises NoEvents when there are none,
        RuntimeFailure when Spark fails."""
        if window_s != self._window_s:  # the cells are per window: start again
            self._held, self._files, self._window_s = None, frozenset(), window_s
        started = time.monotonic()
        new = gather(self._files, window_s)
        if not new.files:
            raise NoEvents("no events written yet")
        try:
            with ThreadPoolExecutor(1) as pool:  # Spark starts while the files are read
                spark = pool.submit(self._start, log_dir or out_dir, progress)
                new = new.ready()
                spark.result()
            self._refresh(new, progress)
            tables, small = self._tables(window_s, out_dir, progress)
        except Exception as err:
            if isinstance(err, RayqError):
                raise
            raise RuntimeFailure(f"the Spark report failed: {_first_line(err)} "
                                 f"(Spark's log: {self.log})") from err
        progress("plotting")
        periods = page.periods(small)
        plots = page.make_plots(small, out_dir, periods)
        progress("writing the page")
        html = page.write_html(small, plots, out_dir, self.held, periods, current)
        self.reports += 1
        return Report(html, tables, plots, self.held, time.monotonic() - started, new.reads)

    def start(self, log_dir: str) -> None:
        """Start Spark now (a report would start it anyway), logging under ``log_dir``."""
        self._start(log_dir, lambda step: None)

    def stop(self) -> None:
        """Stop Spark (its executors leave the cluster); this object cannot start again."""
        if self._spark is not None:
            import raydp

            self._held = None
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

    def _refresh(self, new: NewEvents, progress: Callable[[str], None]) -> None:
        """Fold ``new``'s aggregates into those held."""
        from rayq.analytics import jobs

        if new.again:  # a file read earlier has gone: ``new`` holds every file's events
            self._held = None
        if new.cells:
            progress(f"merging {new.events:,} new events")
            partitions = _partitions(self._held.cells_held if self._held else 0,
                                     self.config.shuffle_partitions)
            self._shuffle(partitions)
            self._held = jobs.fold(self._held, self._dataframe(new.cells, CELL_SCHEMA),
                                   self._dataframe(new.timeline, TIMELINE_SCHEMA),
                                   new.events, partitions)
            # What the fold replaced is no longer reachable: a JVM collection lets
            # Spark's cleaner free its blocks now rather than at its next periodic one.
            self._spark.sparkContext._jvm.System.gc()
        self._files = new.files

    def _shuffle(self, partitions: int) -> None:
        """Shuffles (groupings, joins, sorts) into ``partitions``: the aggregates are
        small, and each partition is a task to schedule."""
        self._spark.conf.set("spark.sql.shuffle.partitions", str(partitions))

    def _dataframe(self, blocks, schema: pa.Schema):
        """Arrow tables (or object refs of them) in Ray's object store as one DataFrame,
        through RayDP: each executor fetches its tables from the object store."""
        import ray
        from pyspark.sql.pandas.types import from_arrow_schema as to_spark_schema
        from raydp.spark.dataset import ray_dataset_to_spark_dataframe

        if not blocks:
            return self._spark.createDataFrame([], to_spark_schema(schema))
        refs = [block if isinstance(block, ray.ObjectRef) else ray.put(block) for block in blocks]
        return ray_dataset_to_spark_dataframe(self._spark, schema, refs).select(*schema.names)

    def _tables(self, window_s: float, out_dir: str, progress: Callable[[str], None]):
        """Every table, collected as Arrow (the tables are aggregates: windows, tenants,
        types) and written as Parquet by this process; the small and plotted ones are
        kept for the page. Returns (paths, small tables)."""
        from rayq.analytics import jobs

        if self._held is None:
            raise NoEvents("the event files hold no events")
        partitions = _partitions(self._held.cells_held, self.config.shuffle_partitions)
        self._shuffle(partitions)
        frames = jobs.all_tables(self._held, window_s, partitions)
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


def _partitions(cells: int, most: int) -> int:
    """Partitions to hold ``cells`` in: one per CELLS_PER_PARTITION, 1 to ``most``."""
    return max(1, min(most, -(-cells // CELLS_PER_PARTITION)))


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
        return spark.report(lambda known, window: local_events(events_dir, known, window), out_dir,
                            config.window_s, progress, current)
    finally:
        spark.stop()
