"""Durable throughput, single-send concurrency, receive latency vs depth, shard memory.

    python benchmarks/throughput.py [--messages 200000] [--deep 1000000] [--seconds 5]

Each figure is printed beside a baseline measured in the same run:
- end-to-end (send_batch -> receive -> delete_batch, fsync on) beside the
  ceiling: raw batched Ray actor calls and raw batched LMDB puts;
- single durable send() from 8 producers beside ray.util.queue.Queue.put;
- receive p50/p99 with --deep messages queued beside 1 000 queued;
- shard RSS with --deep messages queued beside the cache budget + 150 MB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import ray
from ray.util.queue import Queue as RayQueue

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report, run_threads  # noqa: E402
from store import raw_lmdb_puts  # noqa: E402

import rayq  # noqa: E402

BATCH = 500
BODY = "x" * 200


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
    client.create_queue("bench-e2e", subqueues=pipelines, max_receives=None)
    batch = [rayq.Outgoing(BODY, tenant=f"t{i % 4}", type=f"k{i % 3}") for i in range(BATCH)]

    def pipeline(share: int):
        q = rayq.connect().queue("bench-e2e")
        for _ in range(share // BATCH):
            q.send_batch(batch)
            got = q.receive(max_messages=BATCH, visibility_timeout_s=60)
            if got:
                q.delete_batch([m.receipt for m in got])

    threads = [threading.Thread(target=pipeline, args=(messages // pipelines,)) for _ in range(pipelines)]
    with Timer() as t:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    q = client.queue("bench-e2e")
    while q.count():  # what the pipelines left is part of the work
        got = q.receive(max_messages=BATCH, visibility_timeout_s=60)
        q.delete_batch([m.receipt for m in got])
    return messages / (time.perf_counter() - t.start)


def concurrent_sends(seconds: float, producers: int = 8) -> tuple[float, float]:
    rayq.connect().create_queue("bench-send", max_receives=None)
    counts = [0] * producers
    stop = threading.Event()

    def send(i: int):
        q = rayq.connect().queue("bench-send")
        while not stop.is_set():
            q.send(BODY, tenant=f"t{i}")
            counts[i] += 1

    mine = run_threads(send, producers, seconds, stop)
    rq = RayQueue(actor_options={"num_cpus": 0})
    counts_b = [0] * producers
    stop_b = threading.Event()

    def put(i: int):
        while not stop_b.is_set():
            rq.put(BODY)
            counts_b[i] += 1

    base = run_threads(put, producers, seconds, stop_b)
    return sum(counts) / mine, sum(counts_b) / base


def receive_latency(q: rayq.Queue, samples: int = 300) -> tuple[float, float]:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        [m] = q.receive(visibility_timeout_s=600)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1e3, times[int(len(times) * 0.99) - 1] * 1e3


def fill(q: rayq.Queue, n: int) -> None:
    batch = [rayq.Outgoing(BODY, tenant=f"t{i % 4}", type=f"k{i % 3}") for i in range(BATCH)]
    for _ in range(n // BATCH):
        q.send_batch(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rayq-bench-")
    ray.init(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    config = rayq.Config(store=rayq.StoreConfig(shards=2))
    try:
        client = rayq.start(data_dir=os.path.join(root, "data"), config=config)
        lmdb_ceiling = raw_lmdb_puts(os.path.join(root, "raw"), args.messages, BATCH, BODY.encode())
        actor_ceiling = raw_actor_calls(args.messages)
        e2e = end_to_end(client, args.messages)
        sends, ray_queue_puts = concurrent_sends(args.seconds)

        shallow, deep = client.create_queue("bench-shallow"), client.create_queue("bench-deep")
        fill(shallow, 1000)
        p50_shallow, p99_shallow = receive_latency(shallow)
        shard = client.transport.shards[client.transport.route("bench-deep")[0].subqueues[0].shard]
        mem_before = ray.get(shard.process.remote())
        with Timer() as t_fill:
            fill(deep, args.deep)
        mem_deep = ray.get(shard.process.remote())
        p50_deep, p99_deep = receive_latency(deep)
        budget = config.store.cache_budget_bytes
    finally:
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    ceiling = min(lmdb_ceiling, actor_ceiling)
    mib = 1 << 20
    rows = [
        {"figure": "e2e send_batch->receive->delete_batch", "value": e2e, "unit": "msg/s",
         "baseline": "ceiling min(raw actor, raw LMDB)", "baseline_value": ceiling},
        {"figure": "raw batched Ray actor calls", "value": actor_ceiling, "unit": "msg/s"},
        {"figure": "raw batched LMDB puts (fsync)", "value": lmdb_ceiling, "unit": "msg/s"},
        {"figure": "send() x8 producers, durable", "value": sends, "unit": "msg/s",
         "baseline": "ray.util.queue put x8", "baseline_value": ray_queue_puts},
        {"figure": f"receive p50, {args.deep:,} queued", "value": p50_deep, "unit": "ms",
         "baseline": "p50, 1,000 queued", "baseline_value": p50_shallow},
        {"figure": f"receive p99, {args.deep:,} queued", "value": p99_deep, "unit": "ms",
         "baseline": "p99, 1,000 queued", "baseline_value": p99_shallow},
        {"figure": f"shard private memory, {args.deep:,} queued",
         "value": mem_deep["private_bytes"] / mib, "unit": "MiB",
         "baseline": "cache budget + 150 MiB", "baseline_value": budget / mib + 150},
        {"figure": f"shard RSS incl. LMDB file pages, {args.deep:,} queued",
         "value": mem_deep["rss_bytes"] / mib, "unit": "MiB",
         "baseline": "cache budget + 150 MiB", "baseline_value": budget / mib + 150},
        {"figure": "shard private memory before filling", "value": mem_before["private_bytes"] / mib,
         "unit": "MiB"},
        {"figure": f"fill rate ({args.deep:,} via send_batch)", "value": args.deep / t_fill.seconds,
         "unit": "msg/s"},
    ]
    report("throughput", rows, {"messages": args.messages, "deep": args.deep, "batch": BATCH,
                                "body_bytes": len(BODY)})


if __name__ == "__main__":
    main()
