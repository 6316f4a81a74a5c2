"""The report's aggregates: cells folded in any split equal the cells of all events at
once, and their figures equal pyarrow's on the raw events (counts exact, percentiles
within the sketches' rank error). Slices bound the raw events read at once."""

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayq.analytics import reference
from rayq.analytics.cells import (CELL_SCHEMA, COUNTS, NO_NAME, merge_cells, partial_cells,
                                  rank_error, rollup)
from rayq.analytics.eventlog import EventLog, read_events
from rayq.analytics.sources import EventRead, aggregate_event_files, list_event_files

T0 = 1_790_000_040.0
WINDOW_S = 60.0


def events(tmp_path, n=4000, seed=7) -> pa.Table:
    rng, log = random.Random(seed), EventLog(str(tmp_path), "t")
    for i in range(n):
        at = T0 + i * 0.7
        tenant, type_ = rng.choice(("a", "b", "c")), rng.choice(("x", "y"))
        log.append("enqueue", at, tenant=tenant, type=type_, key=type_)
        log.append("completion", at + 0.3, tenant=tenant, type=type_, key=type_,
                   outcome="failed" if i % 13 == 0 else "dead" if i % 29 == 0 else "succeeded",
                   usage_s=rng.uniform(0.0, 2.0), wait_s=rng.expovariate(0.5), attempt=1)
        if i % 17 == 0:
            log.append("deferral", at, tenant=tenant, type=type_, outcome="deferred")
    log.append("fairness", T0, outcome="fair", detail="{}")  # no tenant, no type
    log.flush()
    return read_events(str(tmp_path))


def by_key(cells: pa.Table) -> dict:
    rows = {}
    for r in cells.to_pylist():
        key = (r["window_start"], r["lookback_start"], r["tenant"], r["type"])
        rows[key] = {k: r[k] for k in (*COUNTS, "first_ts", "last_ts", "wait_max", "worst_at")}
        rows[key]["usage_s"] = pytest.approx(r["usage_s"])
    return rows


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 12_000), max_size=4))
def test_cells_folded_in_any_split_equal_the_cells_of_all_events_at_once(tmp_path_factory, cuts):
    table = events(tmp_path_factory.mktemp("ev"))
    bounds = [0, *sorted(set(c for c in cuts if c < table.num_rows)), table.num_rows]
    # shuffled: a later slice may hold earlier events (another node's files, read later)
    table = table.take(pa.array(random.Random(len(cuts)).sample(range(table.num_rows),
                                                                 table.num_rows)))
    folded = CELL_SCHEMA.empty_table()
    for lo, hi in zip(bounds, bounds[1:]):
        folded = merge_cells(pa.concat_tables([folded, partial_cells(table.slice(lo, hi - lo),
                                                                      WINDOW_S)]))
    assert by_key(folded) == by_key(partial_cells(table, WINDOW_S))


def test_cell_figures_equal_pyarrow_on_the_raw_events(tmp_path):
    table = events(tmp_path)
    cells = merge_cells(pa.concat_tables([partial_cells(table.slice(0, 5000), WINDOW_S),
                                          partial_cells(table.slice(5000), WINDOW_S)]))
    exact = reference.main_tables(table, WINDOW_S)
    done = reference.succeeded(table)
    rolled = rollup(cells.filter(pc.greater(cells["completed"], 0)), ["tenant"],
                    sums=("completed", "usage_s"),
                    quantiles={"p50": 0.5, "p95": 0.95, "p99": 0.99})
    for row in rolled.to_pylist():
        want = exact["usage_by_tenant"][row["tenant"]]
        assert row["completed"] == want["completed"]
        assert row["usage_s"] == pytest.approx(want["usage_s"])
        waits = done.filter(pc.equal(done["tenant"], row["tenant"]))["wait_s"].to_pylist()
        for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            assert reference.within_rank(row[name], waits, q, rank_error())
    assert sum(cells["events"].to_pylist()) == table.num_rows
    assert sum(cells["deferrals"].to_pylist()) == len(range(0, 4000, 17))
    assert NO_NAME in cells["tenant"].to_pylist()  # the fairness event's missing tenant


def test_a_value_far_from_the_quantile_is_outside_the_rank_error():
    values = list(range(1000))
    assert reference.within_rank(500, values, 0.5, rank_error())
    assert not reference.within_rank(700, values, 0.5, rank_error())


def test_files_are_aggregated_one_at_a_time_into_the_cells_of_all_their_events(tmp_path):
    table = events(tmp_path / "one")
    for k in range(3):  # the same events in three files
        log = EventLog(str(tmp_path / "three"), f"w{k}")
        for row in table.slice(k * 3000, 3000).to_pylist():
            log.append(row.pop("kind"), row.pop("ts").timestamp(),
                       **{f: v for f, v in row.items() if v is not None})
        log.flush()
    names = list_event_files(tmp_path / "three")
    done = aggregate_event_files(tmp_path / "three", names, WINDOW_S, "n1", "node-1")
    assert len(names) >= 3 and done.read == EventRead("n1", "node-1", len(names), table.num_rows)
    assert by_key(done.cells) == by_key(partial_cells(table, WINDOW_S))
    assert done.timeline.num_rows == 1 and done.timeline["kind"].to_pylist() == ["fairness"]
    assert done.timeline["detail"].to_pylist() == [None]  # a decision's figures are not kept


def test_a_completed_task_counts_as_waiting_in_each_window_from_its_enqueue_to_its_start(tmp_path):
    log = EventLog(str(tmp_path), "t")
    # ends at T0 + 250 after 100 s of work: started at T0 + 150, enqueued at T0 + 30
    log.append("completion", T0 + 250, tenant="a", type="x", outcome="succeeded",
               usage_s=100.0, wait_s=120.0)
    log.append("completion", T0 + 250, tenant="a", type="y", outcome="succeeded",
               usage_s=1.0, wait_s=0.0)   # no wait: waiting nowhere
    log.flush()
    cells = partial_cells(read_events(str(tmp_path)), WINDOW_S)
    waiting = {(r["window_start"] - T0, r["type"]): r["waiting"] for r in cells.to_pylist()
               if r["waiting"]}
    assert waiting == {(0.0, "x"): 1, (60.0, "x"): 1, (120.0, "x"): 1}
