"""The report's page: a headline that says what happened, three plots on local time
axes with the intervention and flood periods shaded, and sorted, formatted tables.

Works on the small tables ``rayq.analytics.warm.run_report`` collected (lists of row dicts); no Spark here.
Times arrive as datetimes (event timestamps) or epoch seconds (window starts) and are
shown in this machine's local time zone.
"""

from __future__ import annotations

import base64
import html
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

Rows = list[dict]
TIME_COLUMNS = ("ts", "window_start", "first_ts", "last_ts", "worst_wait_at")
INTERVENTION, FLOOD = "#f4a261", "#9b5de5"   # shading of the two kinds of period
# Tables shown, in order: (name, title, sort key, descending).
SHOWN = (
    ("usage_by_tenant", "Usage and waits by tenant", "usage_s", True),
    ("usage_by_type", "Usage and waits by job type", "usage_s", True),
    ("intervention_timeline", "Fairness intervention changes", "ts", False),
    ("flood_timeline", "Flood events", "ts", False),
    ("redeliveries", "Failures, redeliveries, dead letters and deferrals", "failed", True),
    ("throughput_by_window", "Throughput by window", "window_start", False),
    ("fairness_index_by_window", "Jain's fairness index by window", "window_start", False),
    ("wait_by_window", "Waits by window and job type", "window_start", False),
    ("usage_share_by_window", "Usage share by window and job type", "window_start", False),
    ("usage_share_by_tenant_window", "Usage share by window and tenant", "window_start", False),
)


@dataclass(frozen=True)
class Period:
    """A span of time to shade: [start, end) in local time, and what it was."""

    start: datetime
    end: datetime
    label: str


def local(value) -> datetime | None:
    """A timestamp (datetime, or epoch seconds) as a naive local datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone().replace(tzinfo=None) if value.tzinfo else value
    return datetime.fromtimestamp(float(value))


def clock(value) -> str:
    moment = local(value)
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def zone() -> str:
    return time.strftime("%Z") or "local time"


# -- periods ---------------------------------------------------------------------------
def periods(small: Mapping[str, Rows]) -> dict[str, list[Period]]:
    """Intervention and flood periods; one still open ends with the last event."""
    end = (small.get("summary") or [{}])[0].get("last_ts")
    return {"intervention": intervention_periods(small.get("intervention_timeline", []), end),
            "flood": flood_periods(small.get("flood_timeline", []), end)}


def intervention_periods(rows: Rows, end) -> list[Period]:
    """From each change to "intervening" until the next change back (or ``end``)."""
    periods, since = [], None
    for row in sorted(rows, key=lambda r: local(r["ts"])):
        if row["state"] == "intervening" and since is None:
            since = local(row["ts"])
        elif row["state"] != "intervening" and since is not None:
            periods.append(Period(since, local(row["ts"]), "intervening"))
            since = None
    if since is not None:
        periods.append(Period(since, max(since, local(end)), "intervening"))
    return periods


def flood_periods(rows: Rows, end) -> list[Period]:
    """Per flooder (queue, type, tenant): from "detected" until "removed" (or ``end``)."""
    periods, open_ = [], {}
    for row in sorted(rows, key=lambda r: local(r["ts"])):
        who = (row["queue"], row["type"], row["tenant"])
        if row["event"] == "detected":
            open_.setdefault(who, local(row["ts"]))
        elif row["event"] == "removed" and who in open_:
            periods.append(Period(open_.pop(who), local(row["ts"]), f"{who[1]}/{who[2]}"))
    periods += [Period(at, max(at, local(end)), f"{w[1]}/{w[2]}") for w, at in open_.items()]
    return periods


# -- plots -------------------------------------------------------------------------------
def make_plots(small: Mapping[str, Rows], out_dir: str, periods: Mapping[str, list[Period]]
               ) -> dict[str, str]:
    """PNG plots by name: usage share, waits and the fairness index over local time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    windows = sorted({r["window_start"] for r in small.get("usage_share_by_window", [])})
    plots = {}
    for name, draw in (("usage_share", _usage_share), ("waits", _waits),
                       ("fairness_index", _fairness_index)):
        fig, ax = plt.subplots(figsize=(9, 3.4))
        draw(ax, small)
        if len(windows) > 1:  # one time axis for all three plots
            ax.set_xlim(local(windows[0]), local(windows[-1]))
        if name != "fairness_index":
            _shade(ax, periods)
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        _time_axis(ax)
        fig.subplots_adjust(left=0.09, right=0.8, bottom=0.2, top=0.88)  # same axes in all
        path = os.path.join(out_dir, f"{name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        plots[name] = path
    return plots


def _time_axis(ax) -> None:
    import matplotlib.dates as mdates

    low, high = ax.get_xlim()  # in days
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=4, maxticks=10))
    ax.xaxis.set_major_formatter(mdates.DateFormatter(
        "%H:%M" if (high - low) * 86400 > 300 else "%H:%M:%S"))
    ax.set_xlabel(f"local time ({zone()})")
    ax.grid(alpha=0.3)


def _shade(ax, periods: Mapping[str, list[Period]]) -> None:
    for kind, colour in (("intervention", INTERVENTION), ("flood", FLOOD)):
        for i, p in enumerate(periods.get(kind, ())):
            ax.axvspan(p.start, p.end, color=colour, alpha=0.25, lw=0,
                       label=f"{kind} periods" if i == 0 else None)


def _usage_share(ax, small) -> None:
    rows = small.get("usage_share_by_window", [])
    types = sorted({r["type"] for r in rows})
    starts = sorted({r["window_start"] for r in rows})
    share = {(r["window_start"], r["type"]): r["usage_share"] for r in rows}
    if starts:
        ax.stackplot([local(s) for s in starts],
                     [[share.get((s, t), 0.0) for s in starts] for t in types], labels=types,
                     step="post")
    ax.set(title="Share of thread time by job type, per window", ylabel="share", ylim=(0, 1))


def _waits(ax, small) -> None:
    rows = small.get("wait_by_window", [])
    for type_ in sorted({r["type"] for r in rows}):
        mine = sorted((r for r in rows if r["type"] == type_), key=lambda r: r["window_start"])
        ax.plot([local(r["window_start"]) for r in mine], [r["wait_max_s"] for r in mine],
                marker=".", label=type_)
    ax.set(title="Longest wait before running, per window and job type", ylabel="seconds")


def _fairness_index(ax, small) -> None:
    rows = [r for r in small.get("fairness_index_by_window", []) if r.get("backlogged", 0) >= 2]
    rows.sort(key=lambda r: r["window_start"])
    ax.plot([local(r["window_start"]) for r in rows], [r["jain_index"] for r in rows],
            marker="o", ls="none" if len(rows) < 2 else "-")
    if not rows:
        ax.text(0.5, 0.5, "no window had two or more backlogged job types",
                ha="center", va="center", transform=ax.transAxes)
    ax.set(title="Jain's fairness index of usage by job type (windows with ≥2 backlogged types)",
           ylabel="index (1: equal)", ylim=(0, 1.05))


# -- the page ----------------------------------------------------------------------------
def write_html(small: Mapping[str, Rows], plots: Mapping[str, str], out_dir: str, events: int,
               periods: Mapping[str, list[Period]],
               current: Mapping[str, float] | None = None) -> str:
    parts = ["<h1>rayq report</h1>", headline(small, events, periods, current or {})]
    for name, title in (("usage_share", "Usage share"), ("waits", "Waits"),
                        ("fairness_index", "Fairness")):
        with open(plots[name], "rb") as f:
            data = base64.b64encode(f.read()).decode()
        parts.append(f'<h2>{title}</h2><img alt="{name}" src="data:image/png;base64,{data}">')
    for name, title, key, descending in SHOWN:
        if name in small:
            rows = sorted(small[name], key=lambda r: _sort_value(r.get(key)), reverse=descending)
            parts.append(f'<h2 id="{name}">{html.escape(title)} <small>({name})</small></h2>'
                         + table(rows))
    page = ("<!doctype html><html lang='en'><meta charset='utf-8'><title>rayq report</title>"
            f"<style>{STYLE}</style><body>" + "".join(parts) + f"<script>{SORT_JS}</script>")
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def headline(small: Mapping[str, Rows], events: int, periods: Mapping[str, list[Period]],
             current: Mapping[str, float]) -> str:
    """What happened, in a few lines: span, counts, the worst wait, interventions,
    floods, and thresholds suggested beside the ones in force."""
    s = (small.get("summary") or [{}])[0]
    first, last = local(s.get("first_ts")), local(s.get("last_ts"))
    span = (f"{clock(first)} to {last.strftime('%H:%M:%S')} {zone()} "
            f"({_duration((last - first).total_seconds())})" if first and last else "-")
    tenants = sorted(r["tenant"] for r in small.get("usage_by_tenant", []) if r["tenant"])
    types = sorted(r["type"] for r in small.get("usage_by_type", []) if r["type"])
    items = [
        ("Time span", span),
        ("Tasks", f"{s.get('completed', 0):,} completed, {s.get('failed', 0):,} failed "
                  f"({events:,} events)"),
        ("Tenants", f"{len(tenants)}: {', '.join(tenants) or '-'}"),
        ("Job types", f"{len(types)}: {', '.join(types) or '-'}"),
        ("Worst wait", f"{_seconds(s['worst_wait_s'])} — tenant {s['worst_wait_tenant']}, "
                       f"type {s['worst_wait_type']}, at {clock(s['worst_wait_at'])}"
         if s.get("worst_wait_s") is not None else "-"),
        ("Interventions", _periods_text(periods.get("intervention", []))),
        ("Floods", _periods_text(periods.get("flood", []), named=True)),
    ]
    rows = "".join(f"<tr><th>{k}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return (f'<table class="headline">{rows}</table>'
            + "<h2>Thresholds: suggested beside current</h2>" + _thresholds(small, current))


def _thresholds(small: Mapping[str, Rows], current: Mapping[str, float]) -> str:
    rows = [{"setting": r["name"], "current": current.get(r["name"]), "suggested": r["value"],
             "basis": r["basis"]} for r in sorted(small.get("suggested_thresholds", []),
                                                  key=lambda r: r["name"])]
    return table(rows, sortable=False)


def _periods_text(periods: list[Period], named: bool = False) -> str:
    if not periods:
        return "none"
    spans = [f"{p.start:%H:%M:%S}–{p.end:%H:%M:%S}" + (f" ({p.label})" if named else "")
             for p in periods]
    total = sum((p.end - p.start).total_seconds() for p in periods)
    return f"{len(periods)}, {_duration(total)} in all: " + ", ".join(spans)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:,.1f} s"


# -- tables ------------------------------------------------------------------------------
def table(rows: Rows, limit: int = 200, sortable: bool = True) -> str:
    if not rows:
        return "<p class='none'>none</p>"
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(_header(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(_cell(c, r.get(c)) for c in columns) + "</tr>" for r in rows[:limit])
    more = f"<p class='none'>{len(rows) - limit:,} more rows in the Parquet table</p>" \
        if len(rows) > limit else ""
    return f"<table class='{'sortable' if sortable else ''}'><thead><tr>{head}</tr></thead>" \
           f"<tbody>{body}</tbody></table>{more}"


def _header(column: str) -> str:
    if column in TIME_COLUMNS:
        return {"ts": "time", "window_start": "window start"}.get(column, column) + f" ({zone()})"
    return column.replace("_", " ")


def _cell(column: str, value) -> str:
    """A formatted cell; ``data-v`` keeps the raw value for sorting."""
    if value is None:
        return "<td>-</td>"
    if column in TIME_COLUMNS:
        moment = local(value)
        return f"<td data-v='{moment.timestamp()}'>{clock(moment)}</td>"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"<td>{html.escape(str(value))}</td>"
    if isinstance(value, int):
        text = f"{value:,}"
    elif "share" in column or column == "jain_index":
        text = f"{value:.1%}" if "share" in column else f"{value:.3f}"
    elif column.endswith("_s"):
        text = f"{value:,.3f}"
    else:
        text = f"{value:,.2f}"
    return f"<td class='n' data-v='{value}'>{text}</td>"


def _sort_value(value):
    if value is None:
        return (0, 0)
    moment = local(value) if isinstance(value, datetime) else None
    return (1, moment.timestamp() if moment else value)


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.3em}h2{margin-top:1.6em;font-size:1.2em}h2 small{color:#888;font-weight:normal}
table{border-collapse:collapse;margin:.4em 0;font-size:13px}
th,td{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}
thead th{background:#f3f4f6;position:sticky;top:0;cursor:pointer}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(even){background:#fafafa}
table.headline th{background:none;width:9em;color:#555}table.headline td{font-size:14px}
img{max-width:100%}.none{color:#888}
"""
# Click a column header to sort by it (numbers and times by their raw values).
SORT_JS = """
document.querySelectorAll('table.sortable th').forEach((th, i) => th.onclick = () => {
  const body = th.closest('table').tBodies[0], asc = th.dataset.asc !== '1';
  const key = td => td.dataset.v !== undefined ? parseFloat(td.dataset.v) : td.textContent;
  [...body.rows].sort((a, b) => { const x = key(a.cells[i]), y = key(b.cells[i]);
    return (x > y ? 1 : x < y ? -1 : 0) * (asc ? 1 : -1); }).forEach(r => body.appendChild(r));
  th.dataset.asc = asc ? '1' : '0';
});
"""
