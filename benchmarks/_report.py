"""Shared output of the benchmarks: a rich table and one JSON line."""

from __future__ import annotations

import json
import platform
import threading
import time
from collections.abc import Callable

import psutil
from rich.console import Console
from rich.table import Table


def machine() -> dict:
    return {"cpus": psutil.cpu_count(), "python": platform.python_version(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}


def report(name: str, rows: list[dict], extra: dict | None = None) -> None:
    """rows: dicts with figure, value, unit, baseline, baseline_value (baseline from the same run)."""
    table = Table(title=f"rayq benchmark: {name}")
    for column in ("figure", "value", "unit", "baseline", "baseline value", "ratio"):
        table.add_column(column, justify="right" if column not in ("figure", "baseline") else "left")
    for row in rows:
        base = row.get("baseline_value")
        ratio = f"{row['value'] / base:.2f}" if base else "-"
        table.add_row(row["figure"], f"{row['value']:,.1f}", row["unit"], row.get("baseline", "-"),
                      f"{base:,.1f}" if base else "-", ratio)
    Console().print(table)
    print(json.dumps({"benchmark": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "machine": machine(), "figures": rows, **(extra or {})}))


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def run_threads(fn: Callable[[int], None], n: int, seconds: float, stop: threading.Event) -> float:
    """Run ``fn(i)`` on ``n`` threads for ``seconds``, then set ``stop`` and join them;
    returns the seconds they ran."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join()
    return time.perf_counter() - start
