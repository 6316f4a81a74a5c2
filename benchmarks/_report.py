"""Shared output of the benchmarks: a rich table and one JSON line."""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table


def local_ray(**options: Any) -> None:
    """``ray.init(**options)`` of a private Ray listening on 127.0.0.1 only, as the
    embedded runtime's and the tests' (left alone, Ray takes the machine's network
    address): a benchmark's traffic never leaves loopback."""
    import ray

    from rayq.runtime.session import LOOPBACK, loopback_only

    loopback_only()
    ray.init(_node_ip_address=LOOPBACK, **options)


def machine() -> dict:
    return {"cpus": psutil.cpu_count(), "python": platform.python_version(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}


def report(name: str, rows: list[dict], extra: dict | None = None) -> None:
    """rows: dicts with figure, value, unit, baseline, baseline_value (baseline from the same
    run) and optionally target (the ratio to reach, as text); a missing value prints "-"."""
    table = Table(title=f"rayq benchmark: {name}")
    columns = ["figure", "value", "unit", "baseline", "baseline value", "ratio"]
    targets = any("target" in row for row in rows)
    for column in columns + (["target"] if targets else []):
        table.add_column(column, justify="left" if column in ("figure", "baseline") else "right")
    for row in rows:
        value, base = row.get("value"), row.get("baseline_value")
        ratio = f"{value / base:.2f}" if value is not None and base else "-"
        cells = [row["figure"], f"{value:,.1f}" if value is not None else "-", row["unit"],
                 row.get("baseline", "-"), f"{base:,.1f}" if base else "-", ratio]
        table.add_row(*cells, *([row.get("target", "-")] if targets else []))
    Console().print(table)
    print(json.dumps({"benchmark": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "machine": machine(), "figures": rows, **(extra or {})}))


def cpu_by_process() -> dict[tuple[str, int], float]:
    """CPU seconds so far of this process ("driver") and every live descendant (the Ray
    runtime, redis-server, Dramatiq workers), by (short name or process title, pid)."""
    out = {}
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            title = "driver" if process.pid == os.getpid() else process.cmdline()[0]
            times = process.cpu_times()
        except (psutil.Error, IndexError):
            continue  # ended meanwhile
        short = os.path.basename(title.split()[0]).split(".")[0]
        out[(short, process.pid)] = times.user + times.system
    return out


def cpu_since(before: dict[tuple[str, int], float]) -> float:
    """CPU seconds the whole run spent since ``before`` (a :func:`cpu_by_process`): what
    it costs the machine, which other load on it does not change the way it changes
    throughput. Each live process counts what it spent since, a new one all it spent; one
    that ended meanwhile is left out, not subtracted (a Dramatiq worker stopped during a
    later figure would otherwise make that figure's CPU negative). Matched by pid: a Ray
    worker's title changes when it becomes an actor."""
    then = {pid: s for (_, pid), s in before.items()}
    return sum(s - then.get(pid, 0.0) for (_, pid), s in cpu_by_process().items())


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


def join_threads(fn: Callable[[int], None], n: int) -> float:
    """Run ``fn(i)`` once on each of ``n`` threads until all return; the seconds taken."""
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    with Timer() as t:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    return t.seconds


def rate_on_threads(op: Callable[[int], Any], n: int, seconds: float) -> float:
    """Call ``op(i)`` in a loop on each of ``n`` threads for ``seconds``; calls per second."""
    counts, stop = [0] * n, threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            op(i)
            counts[i] += 1

    ran_s = run_threads(loop, n, seconds, stop)
    return sum(counts) / ran_s


def submit_then_wait(submit: Callable[[int], Any], wait: Callable[[Sequence], Any], count: int,
                     threads: int) -> float:
    """Submit ``count`` items (``submit(i)``) from ``threads`` threads, then ``wait`` for all
    their handles; items per second over both."""
    with Timer() as t:
        with ThreadPoolExecutor(threads) as pool:
            handles = list(pool.map(submit, range(count)))
        wait(handles)
    return count / t.seconds
