"""Durable throughput, single-send concurrency, receive latency vs depth, shard memory.

    python benchmarks/throughput.py [--messages 200000] [--deep 1000000] [--seconds 5]

Each figure is printed beside a baseline measured in the same run:
- end-to-end (send_batch -> receive -> delete_batch, fsync on) beside the
  ceiling: raw batched Ray actor calls and raw batched LMDB puts;
- single durable send() from 8 producers beside ray.util.queue.Queue.put;
- receive p50/p99 with --deep messages queued beside 1 000 queued in the same queue;
- the shard's private memory (RSS less file-backed and shared pages) with --deep
  messages queued beside the cache budget + 150 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

import psutil
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _peers import BATCH, BODY, ray_queue_puts  # noqa: E402
from _report import Timer, join_threads, local_ray, rate_on_threads, report  # noqa: E402
from store import raw_lmdb_figures  # noqa: E402

import rayq  # noqa: E402
from rayq.names import namespace, shard_name  # noqa: E402

SHALLOW = 1000
LATENCY_SAMPLES = 300
WARM_UP_RECEIVES = 50


@ray.remote(num_cpus=0)
class Sink:
    def take(self, items):
        return len(items)


def raw_actor_calls(messages: int) -> float:
    sink = Sink.remote()
    items = [BODY.encode()] * BATCH
    ray.get(sink.take.remote(items))
    with Timer() as t:
        refs = [sink.take.remote(items) for _ in range(messages // BATCH)]
        ray.get(refs)
    return messages / t.seconds


def end_to_end(client: rayq.Client, messages: int, pipelines: int = 2) -> float:
    """Messages per second through ``pipelines`` threads of send_batch(500) -> receive(500)
    -> delete_batch on one queue of ``pipelines`` subqueues."""
    client.create_queue("bench-e2e", subqueues=pipelines, max_receives=None)
    batch = [rayq.Outgoing(BODY, tenant=f"t{i % 4}", type=f"k{i % 3}") for i in range(BATCH)]
    queues = [rayq.connect().queue("bench-e2e") for _ in range(pipelines)]

    def pipeline(i: int):
        q = queues[i]
        for _ in range(messages // pipelines // BATCH):
            q.send_batch(batch)
            got = q.receive(max_messages=BATCH, visibility_timeout_s=60)
            if got:
                q.delete_batch([m.receipt for m in got])

    start = time.perf_counter()
    join_threads(pipeline, pipelines)
    q = client.queue("bench-e2e")
    while q.count():  # what the pipelines left is part of the work
        got = q.receive(max_messages=BATCH, visibility_timeout_s=60)
        q.delete_batch([m.receipt for m in got])
    return messages / (time.perf_counter() - start)


def concurrent_sends(seconds: float, producers: int = 8) -> float:
    """Durable single send() calls per second from ``producers`` threads sharing one
    client, as a threaded producer holds one (its sends coalesce into shared puts, the
    way redis-py threads share one server's fsync)."""
    queue = rayq.connect().create_queue("bench-send", max_receives=None)
    return rate_on_threads(lambda i: queue.send(BODY, tenant=f"t{i}"), producers, seconds)


def own_client_sends(seconds: float, producers: int = 8) -> float:
    """As :func:`concurrent_sends`, but each thread calls ``rayq.connect()`` itself, as
    code that opens a client where it needs one does: clients of one process with the
    same credentials share their transport, so these sends coalesce too."""
    rayq.connect().create_queue("bench-send", max_receives=None)
    queues = [rayq.connect().queue("bench-send") for _ in range(producers)]
    return rate_on_threads(lambda i: queues[i].send(BODY, tenant=f"t{i}"), producers, seconds)


def receive_latency(q: rayq.Queue, samples: int = LATENCY_SAMPLES) -> tuple[float, float]:
    """(p50, p99) in ms of single receives, after WARM_UP_RECEIVES untimed ones."""
    for _ in range(WARM_UP_RECEIVES):
        q.receive(visibility_timeout_s=600)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        [m] = q.receive(visibility_timeout_s=600)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1e3, times[int(len(times) * 0.99) - 1] * 1e3


def fill(q: rayq.Queue, n: int) -> None:
    """Send at least ``n`` messages, in whole batches of BATCH."""
    batch = [rayq.Outgoing(BODY, tenant=f"t{i % 4}", type=f"k{i % 3}") for i in range(BATCH)]
    for _ in range(-(-n // BATCH)):
        q.send_batch(batch)


def shard_memory(index: int) -> dict:
    """A shard process's memory: RSS, private (RSS less file-backed and shared pages, as
    the shard reports it) and USS (pages only it maps, read here with psutil; that
    includes the LMDB file pages no other process maps, so it overstates what the
    shard allocated)."""
    process = ray.get(ray.get_actor(shard_name(index), namespace=namespace()).process.remote())
    uss = psutil.Process(process["pid"]).memory_full_info().uss
    return {**process, "uss_bytes": uss}


def depth_figures(client: rayq.Client, deep: int) -> dict:
    """Receive p50/p99 with SHALLOW then ``deep`` messages queued in the same queue, each
    after the same warm-up; the queue's shard memory before and after filling, and how
    long filling took."""
    q = client.create_queue("bench-depth", max_receives=None)
    [subqueue] = q.stats().subqueues
    fill(q, SHALLOW + WARM_UP_RECEIVES + LATENCY_SAMPLES)
    p50_shallow, p99_shallow = receive_latency(q)
    memory_before = shard_memory(subqueue["shard"])
    with Timer() as t_fill:
        fill(q, deep - q.count())
    memory_deep = shard_memory(subqueue["shard"])
    p50_deep, p99_deep = receive_latency(q)
    return {"p50_shallow_ms": p50_shallow, "p99_shallow_ms": p99_shallow,
            "p50_deep_ms": p50_deep, "p99_deep_ms": p99_deep, "memory_before": memory_before,
            "memory_deep": memory_deep, "fill_s": t_fill.seconds, "deep": q.count()}


def depth_rows(depth: dict, budget_bytes: int, targets: bool = False) -> list[dict]:
    """The table rows of :func:`depth_figures`, with their targets if ``targets``."""
    mib, deep = 1 << 20, depth["deep"]
    ceiling = {"baseline": "cache budget + 150 MiB", "baseline_value": budget_bytes / mib + 150,
               **({"target": "<= 1.00"} if targets else {})}
    return [
        {"figure": f"receive p50, {deep:,} queued", "value": depth["p50_deep_ms"], "unit": "ms",
         "baseline": f"p50, {SHALLOW:,} queued, same queue",
         "baseline_value": depth["p50_shallow_ms"], **({"target": "<= 1.25"} if targets else {})},
        {"figure": f"receive p99, {deep:,} queued", "value": depth["p99_deep_ms"], "unit": "ms",
         "baseline": f"p99, {SHALLOW:,} queued, same queue",
         "baseline_value": depth["p99_shallow_ms"], **({"target": "<= 2.00"} if targets else {})},
        {"figure": f"shard private memory (RSS - shared), {deep:,} queued",
         "value": depth["memory_deep"]["private_bytes"] / mib, "unit": "MiB", **ceiling},
        {"figure": f"shard USS (incl. LMDB pages only it maps), {deep:,} queued",
         "value": depth["memory_deep"]["uss_bytes"] / mib, "unit": "MiB"},
        {"figure": f"shard RSS incl. LMDB file pages, {deep:,} queued",
         "value": depth["memory_deep"]["rss_bytes"] / mib, "unit": "MiB"},
        {"figure": "shard private memory before filling",
         "value": depth["memory_before"]["private_bytes"] / mib, "unit": "MiB"},
        {"figure": f"fill rate to {deep:,} (send_batch, 1 thread)", "value": deep / depth["fill_s"],
         "unit": "msg/s"},
    ]


def consumers_up(client: rayq.Client, count: int, timeout_s: float = 120.0) -> None:
    """Wait until ``count`` consumers answer. rayq.start() returns once the shards and the
    control actors serve; the consumers start behind it, and a figure measured meanwhile
    would count their process starts (a few CPU-seconds on two cores) as its own."""
    deadline = time.monotonic() + timeout_s
    while len(client.consumer_stats()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} consumers up after {timeout_s:.0f} s")
        time.sleep(0.2)


@contextlib.contextmanager
def runtime(config: rayq.Config, prefix: str = "rayq-bench-"):
    """A private local Ray (2 CPUs) and a rayq runtime with data in a temporary directory,
    its consumers up; yields (client, that directory); stops both and removes the
    directory after."""
    root = tempfile.mkdtemp(prefix=prefix)
    local_ray(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    try:
        client = rayq.start(data_dir=os.path.join(root, "data"), config=config)
        consumers_up(client, config.consumers.bounds[0])
        yield client, root
    finally:
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    config = rayq.Config(store=rayq.StoreConfig(shards=2))
    with runtime(config) as (client, root):
        # the same three fsync'd transactions per batch (put, hide, delete) on bare LMDB
        lmdb_ceiling = raw_lmdb_figures(os.path.join(root, "raw"), args.messages, BATCH,
                                        BODY.encode())["end_to_end"]
        actor_ceiling = raw_actor_calls(args.messages)
        e2e = end_to_end(client, args.messages)
        sends = concurrent_sends(args.seconds)
        puts = ray_queue_puts(args.seconds)
        depth = depth_figures(client, args.deep)
    ceiling = min(lmdb_ceiling, actor_ceiling)
    rows = [
        {"figure": "e2e send_batch->receive->delete_batch", "value": e2e, "unit": "msg/s",
         "baseline": "ceiling min(raw actor, raw LMDB)", "baseline_value": ceiling},
        {"figure": "raw batched Ray actor calls", "value": actor_ceiling, "unit": "msg/s"},
        {"figure": "bare LMDB put + hide + delete per batch (fsync)", "value": lmdb_ceiling,
         "unit": "msg/s"},
        {"figure": "send() x8 producers, durable", "value": sends, "unit": "msg/s",
         "baseline": "ray.util.queue put x8", "baseline_value": puts},
        *depth_rows(depth, config.store.cache_budget_bytes),
    ]
    report("throughput", rows, {"messages": args.messages, "deep": args.deep, "batch": BATCH,
                                "body_bytes": len(BODY), "fill_s": depth["fill_s"]})


if __name__ == "__main__":
    main()
