"""Durable throughput, single-send concurrency, receive latency vs depth, shard memory.

    python benchmarks/throughput.py [--messages 200000] [--deep 1000000] [--seconds 5]

Each figure is printed beside a baseline measured in the same run, with the same
work, warm-up and window (set-up such as creating actors or connecting happens
before every timed window, and one untimed round warms each side up):
- end-to-end (send_batch -> receive -> delete_batch, fsync on, 2 pipelines) beside
  the same three-step cycle on bare parts: three Ray actor round trips per batch,
  and three fsync'd LMDB transactions per batch, 2 pipelines each;
- single durable send() from 8 producers beside ray.util.queue.Queue.put from 8
  (in memory, not durable: a peer for the cost of durability, not a ceiling);
- receive p50/p99 on one queue with --deep messages queued beside the same queue
  with 1 000 queued, both after a warm-up;
- shard memory with --deep messages queued beside the same shard before filling;
  the design's memory target (cache budget + 150 MiB) is a row of its own,
  labelled as a target, not a measurement.
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
from store import RawLmdb  # noqa: E402

import rayq  # noqa: E402

BATCH = 500
BODY = "x" * 200


PIPELINES = 2


@ray.remote(num_cpus=0)
class Sink:
    """A bare actor holding items: send, receive and delete as plain round trips."""

    def __init__(self):
        self.items: list = []

    def take(self, items):
        self.items.extend(items)
        return len(items)

    def give(self, n):
        out, self.items = self.items[:n], self.items[n:]
        return out

    def forget(self, items):
        return len(items)


def in_pipelines(cycle, shares: list) -> float:
    """Run ``cycle(share)`` on one thread per share; the seconds until all finished."""
    threads = [threading.Thread(target=cycle, args=(share,)) for share in shares]
    with Timer() as t:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    return t.seconds


def raw_actor_cycles(messages: int) -> float:
    """msg/s of three actor round trips per batch (send, receive, delete), like e2e."""
    sinks = [Sink.remote() for _ in range(PIPELINES)]
    items = [BODY.encode()] * BATCH

    def cycle(sink, batches: int = 1):
        for _ in range(batches):
            ray.get(sink.take.remote(items))
            ray.get(sink.forget.remote(ray.get(sink.give.remote(BATCH))))

    for sink in sinks:
        cycle(sink)  # warm-up: the actor is up and each call path is hot
    seconds = in_pipelines(lambda sink: cycle(sink, messages // PIPELINES // BATCH), sinks)
    return messages / seconds


def raw_lmdb_cycles(root: str, messages: int) -> float:
    """msg/s of three fsync'd LMDB transactions per batch (put, hide, delete), like e2e
    on PIPELINES shards: one environment per pipeline."""
    envs = [RawLmdb(os.path.join(root, f"raw-{i}"), BODY.encode()) for i in range(PIPELINES)]
    batches = messages // PIPELINES // BATCH

    def cycle(raw, first: int = 0, n: int = 1):
        for b in range(first, first + n):
            raw.put(b * BATCH, BATCH)
            raw.delete(raw.receive(BATCH))

    for raw in envs:
        cycle(raw)  # warm-up
    seconds = in_pipelines(lambda raw: cycle(raw, 1, batches), envs)
    for raw in envs:
        raw.close()
    return messages / seconds


def end_to_end(client: rayq.Client, messages: int) -> float:
    client.create_queue("bench-e2e", subqueues=PIPELINES, max_receives=None)
    batch = [rayq.Outgoing(BODY, tenant=f"t{i % 4}", type=f"k{i % 3}") for i in range(BATCH)]
    queues = [rayq.connect().queue("bench-e2e") for _ in range(PIPELINES)]

    def cycle(q, batches: int = 1):
        for _ in range(batches):
            q.send_batch(batch)
            got = q.receive(max_messages=BATCH, visibility_timeout_s=60)
            if got:
                q.delete_batch([m.receipt for m in got])

    for q in queues:
        cycle(q)  # warm-up
        drain(q)
    seconds = in_pipelines(lambda q: cycle(q, messages // PIPELINES // BATCH), queues)
    with Timer() as t_drain:  # what the pipelines left is part of the work
        drain(client.queue("bench-e2e"))
    return messages / (seconds + t_drain.seconds)


def drain(q: rayq.Queue) -> None:
    while q.count():
        got = q.receive(max_messages=BATCH, visibility_timeout_s=60)
        q.delete_batch([m.receipt for m in got])


def concurrent_sends(seconds: float, producers: int = 8) -> tuple[float, float]:
    """Sends/s of ``producers`` threads for ``seconds``: durable send() beside
    ray.util.queue put. Both sides are created and warmed up before their window."""
    rayq.connect().create_queue("bench-send", max_receives=None)
    queues = [rayq.connect().queue("bench-send") for _ in range(producers)]
    rq = RayQueue(actor_options={"num_cpus": 0})
    for i in range(producers):  # warm-up: the actors are up, every path has run once
        queues[i].send(BODY, tenant=f"t{i}")
        rq.put(BODY)
    return (rate_of(lambda i: queues[i].send(BODY, tenant=f"t{i}"), producers, seconds),
            rate_of(lambda i: rq.put(BODY), producers, seconds))


def rate_of(op, producers: int, seconds: float) -> float:
    """Calls/s of ``op(i)`` from ``producers`` threads over a ``seconds`` window."""
    counts, stop = [0] * producers, threading.Event()

    def loop(i: int):
        while not stop.is_set():
            op(i)
            counts[i] += 1

    ran_s = run_threads(loop, producers, seconds, stop)
    return sum(counts) / ran_s


def receive_latency(q: rayq.Queue, samples: int = 300, warm_up: int = 50) -> tuple[float, float]:
    """p50 and p99 ms of single receives (each hides its message for 10 min)."""
    for _ in range(warm_up):
        q.receive(visibility_timeout_s=600)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        [m] = q.receive(visibility_timeout_s=600)
        times.append(time.perf_counter() - t0)
    times.sort()
    return statistics.median(times) * 1e3, times[int(len(times) * 0.99) - 1] * 1e3


def fill(q: rayq.Queue, n: int) -> None:
    batch = [rayq.Outgoing(BODY, tenant=f"t{i % 4}", type=f"k{i % 3}") for i in range(BATCH)]
    for start in range(0, n, BATCH):
        q.send_batch(batch[:n - start])


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
        lmdb_ceiling = raw_lmdb_cycles(root, args.messages)
        actor_ceiling = raw_actor_cycles(args.messages)
        e2e = end_to_end(client, args.messages)
        sends, ray_queue_puts = concurrent_sends(args.seconds)

        # one queue for both depths: the same shard, subqueue and keys; 1 000 stay
        # visible through the shallow samples and their warm-up
        queue = client.create_queue("bench-latency")
        shard = client._shards[client._route("bench-latency")[0].subqueues[0].shard]
        mem_before = ray.get(shard.process.remote())
        fill(queue, 1000 + 350)
        p50_shallow, p99_shallow = receive_latency(queue)
        with Timer() as t_fill:
            fill(queue, args.deep)
        mem_deep = ray.get(shard.process.remote())
        p50_deep, p99_deep = receive_latency(queue)
        budget = config.store.cache_budget_bytes
    finally:
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    ceiling = min(lmdb_ceiling, actor_ceiling)
    mib = 1 << 20
    rows = [
        {"figure": "e2e send_batch->receive->delete_batch", "value": e2e, "unit": "msg/s",
         "baseline": "ceiling: min of the two bare cycles", "baseline_value": ceiling},
        {"figure": "bare cycle: 3 Ray actor round trips/batch", "value": actor_ceiling,
         "unit": "msg/s"},
        {"figure": "bare cycle: 3 fsync'd LMDB txns/batch", "value": lmdb_ceiling, "unit": "msg/s"},
        {"figure": "send() x8 producers, durable", "value": sends, "unit": "msg/s",
         "baseline": "ray.util.queue put x8 (not durable)", "baseline_value": ray_queue_puts},
        {"figure": f"receive p50, {args.deep:,} queued", "value": p50_deep, "unit": "ms",
         "baseline": "same queue, 1,000 queued", "baseline_value": p50_shallow},
        {"figure": f"receive p99, {args.deep:,} queued", "value": p99_deep, "unit": "ms",
         "baseline": "same queue, 1,000 queued", "baseline_value": p99_shallow},
        {"figure": f"shard private memory, {args.deep:,} queued",
         "value": mem_deep["private_bytes"] / mib, "unit": "MiB",
         "baseline": "same shard before filling", "baseline_value": mem_before["private_bytes"] / mib},
        {"figure": f"shard RSS incl. LMDB file pages, {args.deep:,} queued",
         "value": mem_deep["rss_bytes"] / mib, "unit": "MiB",
         "baseline": "same shard before filling", "baseline_value": mem_before["rss_bytes"] / mib},
        {"figure": "target (not measured): cache budget + 150 MiB", "value": budget / mib + 150,
         "unit": "MiB"},
        {"figure": f"fill rate ({args.deep:,} via send_batch)", "value": args.deep / t_fill.seconds,
         "unit": "msg/s"},
    ]
    report("throughput", rows, {"messages": args.messages, "deep": args.deep, "batch": BATCH,
                                "body_bytes": len(BODY)})


if __name__ == "__main__":
    main()
