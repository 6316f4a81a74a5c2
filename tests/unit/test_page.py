"""The report page's pure parts: periods from timelines, local times, cell formats."""

from datetime import datetime, timezone

import pytest

from rayq.analytics import page

T0 = 1_790_000_000.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=timezone.utc)


@pytest.mark.parametrize("states, end, expected", [
    (["fair", "intervening", "fair"], 100, [(10, 20)]),
    (["intervening", "intervening", "fair"], 100, [(0, 20)]),
    (["fair", "intervening", "intervening"], 100, [(10, 100)]),      # still open at the end
    (["intervening", "fair", "intervening", "fair"], 100, [(0, 10), (20, 30)]),
    (["fair", "fair"], 100, []),
])
def test_intervention_periods_run_from_intervening_to_the_next_change_back(states, end, expected):
    rows = [{"ts": at(10 * i), "state": s} for i, s in enumerate(states)]
    got = page.intervention_periods(rows, T0 + end)
    assert [(p.start, p.end) for p in got] == [(page.local(T0 + a), page.local(T0 + b))
                                               for a, b in expected]


def test_flood_periods_are_per_flooder_and_stay_open_until_removed():
    rows = [{"ts": at(1), "queue": "q", "type": "a", "tenant": "x", "event": "detected"},
            {"ts": at(2), "queue": "q", "type": "b", "tenant": "y", "event": "detected"},
            {"ts": at(3), "queue": "q", "type": "a", "tenant": "x", "event": "isolated"},
            {"ts": at(5), "queue": "q", "type": "a", "tenant": "x", "event": "removed"}]
    got = {p.label: (p.start, p.end) for p in page.flood_periods(rows, T0 + 9)}
    assert got == {"a/x": (page.local(T0 + 1), page.local(T0 + 5)),
                   "b/y": (page.local(T0 + 2), page.local(T0 + 9))}


def test_epoch_seconds_and_aware_datetimes_show_as_the_same_local_time():
    assert page.local(T0) == page.local(at(0)) == datetime.fromtimestamp(T0)
    assert page.clock(T0) == datetime.fromtimestamp(T0).strftime("%Y-%m-%d %H:%M:%S")
    assert page.clock(None) == "-"


@pytest.mark.parametrize("column, value, shown", [
    ("window_start", T0, datetime.fromtimestamp(T0).strftime("%Y-%m-%d %H:%M:%S")),
    ("completed", 12345, "12,345"),
    ("usage_share", 0.3456, "34.6%"),
    ("jain_index", 0.98765, "0.988"),
    ("wait_p99_s", 1.23456, "1.235"),
    ("value", 1042.4, "1,042.40"),
    ("tenant", "acme", "acme"),
    ("tenant", None, "-"),
])
def test_cells_are_formatted_by_column(column, value, shown):
    cell = page._cell(column, value)
    assert cell.rsplit("</td>", 1)[0].endswith(f">{shown}")
    assert "e+0" not in cell.split(">", 1)[1]


def test_tables_keep_at_most_the_limit_and_say_how_many_more():
    html = page.table([{"n": i} for i in range(5)], limit=3)
    assert html.count("<tr>") == 4 and "2 more rows" in html
