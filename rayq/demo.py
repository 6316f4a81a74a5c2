"""The workload of ``rayq demo``: several tenants submit several job types, which
the runtime's consumers run; the summary comes from the consumers' reports.

The handlers live here (not in ``__main__``) so consumers import them by name.
"""

from __future__ import annotations

import hashlib
import random
import time
from concurrent.futures import ThreadPoolExecutor

import ray

import rayq

TENANTS = ("acme", "globex", "initech")


@rayq.task(type="report")
def build_report(org: str, rows: int) -> dict:
    """A few milliseconds of hashing: a CPU-bound job."""
    digest = hashlib.sha256(org.encode())
    for i in range(rows):
        digest.update(i.to_bytes(4, "big"))
    return {"org": org, "digest": digest.hexdigest()[:12]}


@rayq.task(type="email")
def send_email(to: str) -> str:
    """An I/O-bound job: waits on a pretend mail server."""
    time.sleep(0.005)
    return f"sent to {to}"


@rayq.task(type="export", concurrency=2)
def export_table(table: str, pause_s: float) -> int:
    """A slow job limited to two at a time across the cluster."""
    time.sleep(pause_s)
    return len(table)


def submit_workload(client, tasks: int, seed: int = 7) -> list:
    """Submit ``tasks`` tasks from 8 threads (concurrent submits share durable puts)."""
    rng = random.Random(seed)
    calls = []
    for i in range(tasks):
        tenant = rng.choice(TENANTS)
        kind = rng.choices(["report", "email", "export"], weights=[5, 4, 1])[0]
        if kind == "report":
            calls.append((build_report, (tenant, 2_000), tenant))
        elif kind == "email":
            calls.append((send_email, (f"ops@{tenant}.example",), tenant))
        else:
            calls.append((export_table, (f"{tenant}_orders_{i}", 0.02), tenant))
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda c: client.submit(c[0], *c[1], tenant=c[2]), calls))


def wait_all(refs: list, on_done=None) -> int:
    """Wait for every ref; returns how many raised. ``on_done(n)`` reports progress."""
    pending, failed = list(refs), 0
    while pending:
        done, pending = ray.wait(pending, num_returns=min(len(pending), 100), timeout=1.0)
        for ref in done:
            try:
                ray.get(ref)
            except rayq.TaskError:
                failed += 1
        if on_done and done:
            on_done(len(done))
    return failed
