"""The report's aggregates, kept between reports: one *cell* per (window, look-back
window, tenant, type), in pyarrow, with no Spark here (Spark runs these functions on
its executors: rayq.analytics.jobs).

A cell holds what every table of the report is made from: counts by kind and outcome,
usage, the first and last event time, the worst wait with when it ended, and the
waits themselves as a KLL quantile sketch (Apache DataSketches'
``kll_doubles_sketch``). Every part merges: counts and sums add, extremes compare,
and KLL sketches merge with the same error bound as one sketch of all the values
(Karnin, Lang and Liberty, "Optimal Quantile Approximation in Streams", 2016). So a
report adds the cells of its new events to the cells held and never reads an old
event again.

Keys: ``window_start`` and ``lookback_start`` (seconds since the epoch: the report's
window, and the flood detector's 30-minute look-back, so enqueues per look-back
window are exact even when the two do not nest) and the tenant and type, a missing
one as :data:`NO_NAME` (joins and group keys need no nulls; the tables show None).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

LOOKBACK_S = 1800.0      # the flood detector's default look-back (10 windows of 180 s)
SKETCH_K = 200           # KLL's k: normalized rank error 1.33 % (99 % confidence)
NO_NAME = "\x00"         # a key's missing tenant or type

KEYS = ("window_start", "lookback_start", "tenant", "type")
COUNTS = ("events", "completions", "completed", "failed", "gone", "enqueues",
          "redeliveries", "dead_letters", "deferrals", "waiting")
TS = pa.timestamp("us", tz="UTC")
CELL_SCHEMA = pa.schema(
    [("window_start", pa.float64()), ("lookback_start", pa.float64()),
     ("tenant", pa.string()), ("type", pa.string())]
    + [(name, pa.int64()) for name in COUNTS]
    + [("first_ts", TS), ("last_ts", TS), ("usage_s", pa.float64()),
       ("wait_max", pa.float64()), ("worst_at", TS), ("wait_sketch", pa.binary())])
# Spark's form of CELL_SCHEMA (mapInArrow's output schema).
CELL_DDL = ", ".join(
    ["window_start double", "lookback_start double", "tenant string", "type string"]
    + [f"{name} bigint" for name in COUNTS]
    + ["first_ts timestamp", "last_ts timestamp", "usage_s double", "wait_max double",
       "worst_at timestamp", "wait_sketch binary"])
SUMMED = COUNTS + ("usage_s",)
# The fairness and flood events, kept as rows (few: decisions and flood steps).
TIMELINE = ("fairness", "flood")
TIMELINE_SCHEMA = pa.schema([("ts", TS), ("kind", pa.string()), ("queue", pa.string()),
                             ("type", pa.string()), ("tenant", pa.string()),
                             ("outcome", pa.string()), ("detail", pa.string())])


def rank_error() -> float:
    """The sketches' normalized rank error for one quantile (99 % confidence): a
    quantile q is answered with a value whose rank lies within q ± this."""
    from datasketches import kll_doubles_sketch

    return kll_doubles_sketch.get_normalized_rank_error(SKETCH_K, False)


def window_of(ts: pa.Array, window_s: float) -> pa.Array:
    """The start (seconds since the epoch, float) of each time's window of ``window_s``:
    the same float operations as Spark's floor(unix_micros(ts) / (window_s * 1e6)) * window_s."""
    micros = pc.cast(pc.cast(ts, pa.int64()), pa.float64())
    return pc.multiply(pc.floor(pc.divide(micros, window_s * 1e6)), window_s)


# -- cells of events ---------------------------------------------------------------------
def partial_cells(events: pa.Table, window_s: float) -> pa.Table:
    """The cells of ``events`` (event-log rows) for windows of ``window_s``."""
    kind, outcome = events["kind"], events["outcome"]

    def flag(condition) -> pa.Array:
        return pc.cast(pc.fill_null(condition, False), pa.int64())

    completion = pc.equal(kind, "completion")
    done = pc.fill_null(pc.and_(completion, pc.equal(outcome, "succeeded")), False)
    rows = pa.table({
        "window_start": window_of(events["ts"], window_s),
        "lookback_start": window_of(events["ts"], LOOKBACK_S),
        "tenant": pc.fill_null(events["tenant"], NO_NAME),
        "type": pc.fill_null(events["type"], NO_NAME),
        "events": pa.array(np.ones(events.num_rows, np.int64)),
        "completions": flag(completion),
        "completed": flag(done),
        "failed": flag(pc.and_(completion, pc.equal(outcome, "failed"))),
        "gone": flag(pc.and_(completion, pc.is_in(outcome, pa.array(["succeeded", "dead"])))),
        "enqueues": flag(pc.equal(kind, "enqueue")),
        "redeliveries": flag(pc.equal(kind, "redelivery")),
        "dead_letters": flag(pc.equal(kind, "dead_letter")),
        "deferrals": flag(pc.equal(kind, "deferral")),
        "waiting": pa.array(np.zeros(events.num_rows, np.int64)),
        "first_ts": events["ts"], "last_ts": events["ts"],
        "usage_s": pc.if_else(done, pc.fill_null(events["usage_s"], 0.0), 0.0),
        "wait_s": pc.fill_null(events["wait_s"], 0.0), "done": done,
    })
    finished = rows.filter(rows["done"])
    counted = rows.drop_columns(["wait_s", "done"])
    waiting = _waiting(events.filter(done), finished, window_s).select(counted.column_names)
    totals = _totals(pa.concat_tables([counted, waiting]))
    waits = _sketched(finished, "wait_s", "first_ts", lambda values, _: _sketch_of(values))
    return _joined(totals, waits)


def _waiting(done: pa.Table, keyed: pa.Table, window_s: float) -> pa.Table:
    """One row per window in which a completed task (rows ``done``, their keys in
    ``keyed``) waited, from its enqueue (start minus wait) to its start (completion
    minus usage): ``waiting`` 1, every other count 0. Summed per cell, ``waiting``
    counts the tasks that waited in it."""
    waited = pc.greater(pc.fill_null(done["wait_s"], 0.0), 0.0)
    done, keyed = done.filter(waited), keyed.filter(waited)
    seconds = pc.divide(pc.cast(pc.cast(done["ts"], pa.int64()), pa.float64()), 1e6)
    started = pc.subtract(seconds, pc.fill_null(done["usage_s"], 0.0)).to_numpy()
    first = np.floor((started - done["wait_s"].to_numpy()) / window_s).astype(np.int64)
    last = np.floor(started / window_s).astype(np.int64)
    spans = last - first + 1
    row = np.repeat(np.arange(done.num_rows), spans)
    windows = (np.repeat(first, spans) + np.arange(row.size)
               - np.repeat(np.cumsum(spans) - spans, spans)) * window_s
    n = row.size
    take = pa.array(row, pa.int64())
    rows = pa.table({
        "window_start": pa.array(windows.astype(np.float64)),
        "lookback_start": pa.array(np.floor(windows / LOOKBACK_S) * LOOKBACK_S),
        "tenant": keyed["tenant"].take(take), "type": keyed["type"].take(take),
        **{name: pa.array(np.zeros(n, np.int64)) for name in COUNTS if name != "waiting"},
        "waiting": pa.array(np.ones(n, np.int64)),
        "first_ts": pa.nulls(n, TS), "last_ts": pa.nulls(n, TS),
        "usage_s": pa.array(np.zeros(n)),
    })
    return rows


def timeline_of(events: pa.Table) -> pa.Table:
    """The fairness and flood events of ``events`` (a flood event's figures kept, a
    fairness decision's not: the report shows only when intervention changed)."""
    marks = events.filter(pc.is_in(events["kind"], pa.array(TIMELINE)))
    detail = pc.if_else(pc.equal(marks["kind"], "flood"), marks["detail"],
                        pa.nulls(marks.num_rows, pa.string()))
    return marks.select(TIMELINE_SCHEMA.names).set_column(
        TIMELINE_SCHEMA.get_field_index("detail"), "detail", detail).cast(TIMELINE_SCHEMA)


def merge_cells(cells: pa.Table) -> pa.Table:
    """``cells`` with the rows of each key merged into one."""
    if cells.num_rows == 0:
        return CELL_SCHEMA.empty_table()
    totals = _totals(cells)
    held = cells.filter(pc.is_valid(cells["wait_sketch"]))
    waits = _sketched(held, "wait_max", "worst_at",
                      lambda _, sketches: _merged(sketches).serialize())
    return _joined(totals, waits)


def merge_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """merge_cells as Spark's mapInArrow calls it: a partition's batches in, its merged
    cells out (every row of a key is in one partition: repartitioned by KEYS)."""
    yield from merge_cells(_table_of(batches, CELL_SCHEMA)).to_batches()


def _totals(rows: pa.Table) -> pa.Table:
    """Per key: the counts and usage summed, the first and last event time."""
    grouped = rows.group_by(list(KEYS), use_threads=False).aggregate(
        [(name, "sum") for name in SUMMED] + [("first_ts", "min"), ("last_ts", "max")])
    return grouped.rename_columns([_unsuffixed(name) for name in grouped.column_names])


def _sketched(rows: pa.Table, wait: str, at: str, sketch) -> pa.Table:
    """Per key of ``rows``: the worst wait (column ``wait``), the earliest time it
    was seen (column ``at``), and ``sketch(waits, serialized sketches)`` of the key's rows."""
    ordered = rows.take(pc.sort_indices(rows, [(k, "ascending") for k in KEYS]
                                        + [(wait, "descending"), (at, "ascending")]))
    starts, ends = _runs(ordered, KEYS)
    waits = ordered[wait].to_numpy()
    sketches = ordered["wait_sketch"] if "wait_sketch" in ordered.column_names else None
    out = [sketch(waits[s:e], sketches[s:e] if sketches is not None else None)
           for s, e in zip(starts, ends)]
    first = ordered.take(pa.array(starts, pa.int64()))
    return pa.table({**{k: first[k] for k in KEYS}, "wait_max": first[wait],
                     "worst_at": first[at], "wait_sketch": pa.array(out, pa.binary())})


def _joined(totals: pa.Table, waits: pa.Table) -> pa.Table:
    """Totals with their keys' waits (none for a key that finished no task)."""
    joined = totals.join(waits, list(KEYS), join_type="left outer", use_threads=False)
    return joined.select(CELL_SCHEMA.names).cast(CELL_SCHEMA)


# -- tables of cells ---------------------------------------------------------------------
def rollup(cells: pa.Table, keys: Sequence[str], sums: Sequence[str] = (),
           maxes: Mapping[str, str] | None = None,
           quantiles: Mapping[str, float] | None = None) -> pa.Table:
    """Per ``keys`` (all rows as one group when empty): ``sums`` summed, ``maxes``
    (output name: column) at their largest, and ``quantiles`` (output name: q) of the
    waits, read from the keys' sketches merged (the cells' waits of finished tasks)."""
    maxes, quantiles = dict(maxes or {}), dict(quantiles or {})
    ordered = cells.take(pc.sort_indices(cells, [(k, "ascending") for k in keys])) \
        if keys else cells
    starts, ends = _runs(ordered, keys)
    first = ordered.take(pa.array(starts, pa.int64()))
    columns = {k: first[k] for k in keys}
    for name in sums:
        values = ordered[name].to_numpy(zero_copy_only=False)
        columns[name] = pa.array([values[s:e].sum() for s, e in zip(starts, ends)])
    for name, column in maxes.items():
        values = ordered[column].to_numpy(zero_copy_only=False)
        columns[name] = pa.array([np.nanmax(values[s:e]) for s, e in zip(starts, ends)],
                                 pa.float64())
    if quantiles:
        sketches = ordered["wait_sketch"]
        merged = [_merged(sketches[s:e]) for s, e in zip(starts, ends)]
        for name, q in quantiles.items():
            columns[name] = pa.array(
                [None if m.is_empty() else m.get_quantile(q) for m in merged], pa.float64())
    return pa.table(columns)


def rollup_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema, **how
                   ) -> Iterator[pa.RecordBatch]:
    """rollup as Spark's mapInArrow calls it (rows of one key all in one partition)."""
    table = _table_of(batches, schema)
    if table.num_rows:
        yield from rollup(table, **how).to_batches()


# -- parts ---------------------------------------------------------------------------------
def _runs(ordered: pa.Table, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the runs of equal ``keys`` in ``ordered`` (sorted by them)."""
    n = ordered.num_rows
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    changed = np.zeros(n - 1, bool)
    for key in keys:
        column = ordered[key].combine_chunks()
        changed |= pc.not_equal(column[1:], column[:-1]).to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], np.flatnonzero(changed) + 1))
    return starts, np.append(starts[1:], n)


def _sketch_of(values: np.ndarray) -> bytes:
    from datasketches import kll_doubles_sketch

    sketch = kll_doubles_sketch(SKETCH_K)
    sketch.update(np.array(values, np.float64))  # a copy: nanobind takes no read-only array
    return sketch.serialize()


def _merged(sketches: pa.Array):
    """One KLL sketch of every serialized sketch in ``sketches`` (nulls skipped)."""
    from datasketches import kll_doubles_sketch

    merged = kll_doubles_sketch(SKETCH_K)
    for data in sketches.to_pylist():
        if data is not None:
            merged.merge(kll_doubles_sketch.deserialize(data))
    return merged


def _unsuffixed(name: str) -> str:
    for suffix in ("_sum", "_min", "_max"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def _table_of(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    batches = list(batches)
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches(batches).select(schema.names).cast(schema)
