"""The ``rayq`` command: demo, status and bench."""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter, defaultdict

import click
from rich.console import Console
from rich.table import Table

import rayq

console = Console()


@click.group()
def main() -> None:
    """rayq: a durable, multi-tenant queue and fair scheduling runtime on Ray."""


@main.command()
@click.option("--data-dir", default=None, help="Where shards keep their data (default ./.rayq-data).")
@click.option("--messages", default=3000, show_default=True, help="Messages to send.")
def demo(data_dir: str | None, messages: int) -> None:
    """Run a small multi-tenant workload on the embedded runtime and summarise it."""
    started = time.monotonic()
    client = rayq.start(data_dir=data_dir)
    console.print(f"runtime up in {time.monotonic() - started:.1f}s, "
                  f"queues: {client.list_queues() or 'none yet'}")
    queue = client.create_queue("demo", subqueues=2)
    queue.clear()
    tenants, types = ["acme", "globex", "initech"], ["report", "email", "export"]
    rng = random.Random(7)
    outgoing = [rayq.Outgoing({"n": i}, tenant=rng.choice(tenants), type=rng.choice(types))
                for i in range(messages)]
    t0 = time.monotonic()
    for i in range(0, messages, 500):
        queue.send_batch(outgoing[i:i + 500])
    send_s = time.monotonic() - t0
    waits, per = defaultdict(list), Counter()
    t0 = time.monotonic()
    while True:
        got = queue.receive(max_messages=250, visibility_timeout_s=30, wait_s=0.2)
        if not got:
            break
        now = time.time()
        for m in got:
            waits[m.tenant].append(now - m.enqueued_at)
            per[(m.tenant, m.type)] += 1
        queue.delete_batch([m.receipt for m in got])
    recv_s = time.monotonic() - t0
    table = Table(title="rayq demo: messages per tenant and type")
    table.add_column("tenant")
    for t in types:
        table.add_column(t, justify="right")
    table.add_column("wait p50 s", justify="right")
    for tenant in tenants:
        table.add_row(tenant, *(str(per[(tenant, t)]) for t in types),
                      f"{statistics.median(waits[tenant]):.3f}" if waits[tenant] else "-")
    console.print(table)
    stats = queue.stats()
    console.print(f"sent {messages} durably in {send_s:.2f}s ({messages / send_s:,.0f} msg/s), "
                  f"received+deleted in {recv_s:.2f}s; left in queue: {stats.depth}; "
                  f"cache hits per shard: {[s['hits'] for s in stats.shards]}")
    rayq.shutdown()


@main.command()
def status() -> None:
    """Print the queues and shards of a running runtime."""
    client = rayq.connect()
    table = Table(title="rayq queues")
    for column in ("queue", "depth", "subqueues", "oldest age s"):
        table.add_column(column)
    for name in client.list_queues():
        stats = client.queue(name).stats()
        oldest = max((k.oldest_age_s for k in stats.keys.values()), default=0.0)
        table.add_row(name, str(stats.depth), str(len(stats.subqueues)), f"{oldest:.1f}")
    console.print(table)
    shards = Table(title="rayq shards")
    for column in ("shard", "messages", "commits", "calls/commit", "cache hits", "bypasses"):
        shards.add_column(column)
    for s in client.stats():
        shards.add_row(str(s.index), str(s.store.messages), str(s.commits),
                       f"{s.calls_committed / max(1, s.commits):.1f}", str(s.store.cache.hits),
                       str(s.store.cache.bypasses))
    console.print(shards)


if __name__ == "__main__":
    main()
