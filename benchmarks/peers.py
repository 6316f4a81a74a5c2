"""rayq beside the stacks a user would pick instead, on this machine, in one run.

    python benchmarks/peers.py [--messages 200000] [--seconds 5] [--tasks 3000]
                               [--deep 1000000] [--value-tasks 300]
                               [--parts e2e,send,tasks,depth,values]

200-byte bodies, every write fsync'd before it is acknowledged. Each rayq
figure sits beside its peer from the same run and its target ratio:
- end-to-end, 2 pipelines of send_batch(500) -> receive(500) -> delete_batch,
  beside Redis Streams (appendfsync always; redis-py pipelines of 500:
  XADD / XREADGROUP / XACK+XDEL), and beside NATS JetStream (file storage,
  sync_interval always; 500 acknowledged publishes -> fetch 500 -> ack each);
- send() from 8 threads beside Redis XADD and ray.util.queue.Queue.put from 8;
- tiny tasks, 3000 submitted from 4 threads then all awaited, beside Dramatiq
  on the same Redis (2 processes x 4 threads) and plain Ray tasks; submit() also beside
  its ceiling, bare calls to an async actor (each submit() makes one, for its ref), and
  that ceiling beside Dramatiq;
- tasks taking and returning a 1 MB numpy array (--value-tasks of them, submit() from
  4 threads then all awaited) beside plain Ray tasks doing the same;
- receive p50/p99 with --deep queued beside 1 000 queued (same queue), and the
  shard's private memory beside the cache budget + 150 MiB (--deep 0 skips), on a
  runtime of their own.

Under each pair, the CPU every process of the run (driver, Ray runtime, redis-server,
Dramatiq workers) spent per item: the figure other load on a shared machine moves
least. Peers come from `pip install -e '.[bench]'` and Debian's redis-server; a missing
one is named and its rows are left empty, the rest still runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable

import numpy as np
import ray

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _peers import (BATCH, BODY, INSTALL, dramatiq_tasks, dramatiq_workers,  # noqa: E402
                    missing_peers, plain_ray_tasks, plain_ray_value_tasks, ray_actor_calls,
                    ray_queue_puts,
                    redis_end_to_end,
                    redis_server, redis_version, redis_xadds)
from _nats_peer import nats_end_to_end, nats_servers  # noqa: E402
from _report import cpu_by_process, cpu_since, report, submit_then_wait  # noqa: E402
from throughput import (concurrent_sends, depth_figures, depth_rows, end_to_end,  # noqa: E402
                        own_client_sends, runtime)

import rayq  # noqa: E402

PARTS = ("e2e", "send", "tasks", "depth", "values")


@rayq.task(type="noop")
def noop(i):
    return i


@rayq.task(type="echo-array")
def echo_array(array):
    return array


MANY = 50  # calls per submit_many


def warm(client: rayq.Client) -> None:
    """Register the handler and run a few hundred tasks first: the consumers' hit-rate
    balancer starts each at load 1 and grows it while receives hit."""
    ray.get(client.submit_many(noop, [(i,) for i in range(300)]))


def rayq_tasks(client: rayq.Client, tasks: int, threads: int = 4) -> float:
    """Durable tiny tasks per second: submit() from ``threads`` threads (one ref and one
    outcome call per task), then ray.get of all."""
    warm(client)
    return submit_then_wait(lambda i: client.submit(noop, i), ray.get, tasks, threads)


def rayq_task_batches(client: rayq.Client, tasks: int, threads: int = 4) -> float:
    """The same tasks through submit_many(MANY calls) from ``threads`` threads: one put
    and one outcome call per batch."""
    warm(client)
    batch = [(i,) for i in range(MANY)]
    rate = submit_then_wait(lambda i: client.submit_many(noop, batch),
                            lambda refs: ray.get([r for many in refs for r in many]),
                            tasks // MANY, threads)
    return rate * MANY


def row(figure: str, value: float | None, unit: str, baseline: str, base: float | None,
        target: str) -> dict:
    return {"figure": figure, "value": value, "unit": unit, "baseline": baseline,
            "baseline_value": base, "target": target}


def measured(fn: Callable[[], float], items: float | None = None,
             seconds: float | None = None) -> tuple[float, float]:
    """(rate ``fn`` returns, CPU µs per item over every process of the run). Items are
    ``items``, or rate x ``seconds`` for a timed figure; set-up inside ``fn`` counts too."""
    before = cpu_by_process()
    rate = fn()
    return rate, cpu_since(before) / (items or rate * seconds) * 1e6


def skipped() -> tuple[None, None]:
    return None, None


def pair(figure: str, unit: str, mine: tuple, peer: tuple, label: str, target: str,
         cpu_target: str = "-") -> list[dict]:
    """The figure beside its peer, then the CPU each spent per item (context, unless
    ``cpu_target`` says what rayq's should be)."""
    return [row(figure, mine[0], unit, label, peer[0], target),
            row("  CPU per item, all processes", mine[1], "µs", label, peer[1], cpu_target)]


def peer_label(name: str, missing: dict[str, str], *needs: str) -> str:
    """``name``, or why it was not measured."""
    absent = [missing[n] for n in needs if n in missing]
    return f"{name} (NOT RUN: {'; '.join(absent)})" if absent else name


def e2e_rows(client, url: str | None, args, missing) -> list[dict]:
    n = args.messages
    figure = "durable e2e, 2 x send_batch(500)->receive(500)->delete_batch"
    mine = measured(lambda: end_to_end(client, n), n)
    redis = measured(lambda: redis_end_to_end(url, n), n) if url else skipped()
    rows = pair(figure, "msg/s", mine, redis,
                peer_label("Redis Streams, appendfsync always, pipelines of 500", missing,
                           "redis-server", "redis"), ">= 2.00", cpu_target="rayq <= 20 µs")
    jetstream = skipped()
    if "nats-server" not in missing and "nats" not in missing:
        with nats_servers(1) as urls:
            jetstream = measured(lambda: nats_end_to_end(urls, args.nats_messages),
                                 args.nats_messages)
    return rows + pair(figure, "msg/s", mine, jetstream,
                       peer_label("NATS JetStream, file storage, sync_interval always",
                                  missing, "nats-server", "nats"), ">= 1.00")


def send_rows(url: str | None, args, missing) -> list[dict]:
    s = args.seconds
    mine = measured(lambda: concurrent_sends(s), seconds=s)
    xadds = measured(lambda: redis_xadds(url, s), seconds=s) if url else skipped()
    puts = measured(lambda: ray_queue_puts(s), seconds=s)
    own = measured(lambda: own_client_sends(s), seconds=s)
    figure = "send() x 8 threads, durable"
    return (pair(figure, "msg/s", mine, xadds,
                 peer_label("Redis XADD x 8 threads", missing, "redis-server", "redis"), ">= 0.75")
            + pair(figure, "msg/s", mine, puts, "ray.util.queue put x 8 threads", ">= 2.00")
            + pair("send() x 8 threads, a client per thread", "msg/s", own, mine,
                   "one shared client, same run", ">= 1.00"))


def task_rows(client, url: str | None, args, missing) -> list[dict]:
    n = args.tasks
    mine = measured(lambda: rayq_tasks(client, n), n)
    calls = measured(lambda: ray_actor_calls(n), n)  # beside submit(), before Ray's workers
    many = measured(lambda: rayq_task_batches(client, n), n)
    dramatiq = skipped()
    if url and "dramatiq" not in missing:
        with dramatiq_workers(url) as actor:  # measured while its workers are alive
            dramatiq = measured(lambda: dramatiq_tasks(actor, n), n)
    plain = measured(lambda: plain_ray_tasks(n), n)
    label = peer_label("Dramatiq, same Redis, 2 processes x 4 threads", missing,
                       "redis-server", "redis", "dramatiq")
    rows = []
    for figure, rate, target in (
            (f"tiny tasks, {n:,} submit() from 4 threads, then all awaited", mine, ">= 1.50"),
            (f"tiny tasks, {n:,} in submit_many({MANY}) from 4 threads", many, ">= 3.00")):
        rows += (pair(figure, "tasks/s", rate, dramatiq, label, target)
                 + pair(figure, "tasks/s", rate, plain, "plain Ray tasks (not durable)", ">= 1.00"))
        if rate is mine:  # a submit() mints its ref by one call to an async actor
            rows += pair(figure, "tasks/s", rate, calls,
                         "ceiling: bare async-actor calls x 4 threads, one per ref", "<= 1.00")
    rows += pair("  the ceiling beside Dramatiq", "calls/s", calls, dramatiq, label, "-")
    return rows


VALUE_BYTES = 1 << 20  # the array each value task takes and returns


def rayq_value_tasks(client: rayq.Client, array: np.ndarray, tasks: int,
                     threads: int = 4) -> float:
    """Durable tasks per second that take ``array`` and return it: submit() from
    ``threads`` threads, then ray.get of all."""
    ray.get([client.submit(echo_array, array) for _ in range(20)])  # consumers warm
    return submit_then_wait(lambda i: client.submit(echo_array, array), ray.get, tasks,
                            threads)


def value_rows(client, args) -> list[dict]:
    n = args.value_tasks
    array = np.random.default_rng(0).standard_normal(VALUE_BYTES // 8)
    mine = measured(lambda: rayq_value_tasks(client, array, n), n)
    plain = measured(lambda: plain_ray_value_tasks(array, n), n)
    return pair(f"tasks of a 1 MB numpy array in and out, {n:,} submit() from 4 threads",
                "tasks/s", mine, plain, "plain Ray tasks, same array (not durable)", "-")


def run(parts: set[str], args, url: str | None, missing: dict, extra: dict) -> list[dict]:
    config = rayq.Config()
    rows: list[dict] = []
    with runtime(config, prefix="rayq-bench-peers-") as (client, _):
        if "e2e" in parts:
            rows += e2e_rows(client, url, args, missing)
        if "send" in parts:
            rows += send_rows(url, args, missing)
        if "tasks" in parts:
            rows += task_rows(client, url, args, missing)
        if "values" in parts:
            rows += value_rows(client, args)
    if "depth" in parts and args.deep > 0:
        # on a Ray and runtime of its own: measured right after the task parts, the
        # shallow p50 read 1.0-3.3 ms and the deep one 1.0-2.3 ms from run to run (1.1-1.2
        # alone), with the runtime still busy from their tasks, not with this queue
        with runtime(config, prefix="rayq-bench-depth-") as (client, _):
            depth = depth_figures(client, args.deep)
        extra["fill_s"] = round(depth["fill_s"], 1)
        rows += depth_rows(depth, config.store.cache_budget_bytes, targets=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000, help="end-to-end messages")
    parser.add_argument("--nats-messages", type=int, default=20_000,
                        help="end-to-end messages through NATS JetStream (it fsyncs each)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each 8-thread send figure")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--value-tasks", type=int, default=300,
                        help="tasks of a 1 MB numpy array (the values part)")
    parser.add_argument("--deep", type=int, default=1_000_000,
                        help="messages queued for the deep receive and memory figures (0 skips)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of "
                        + ", ".join(PARTS))
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if not parts <= set(PARTS):
        parser.error(f"--parts takes some of {', '.join(PARTS)}")
    missing = missing_peers()
    for why in missing.values():
        print(f"peer missing: {why}", file=sys.stderr)
    if missing:
        print(f"install every peer with: {INSTALL}", file=sys.stderr)
    extra = {"messages": args.messages, "nats_messages": args.nats_messages,
             "seconds": args.seconds, "tasks": args.tasks, "value_tasks": args.value_tasks,
             "deep": args.deep, "batch": BATCH, "body_bytes": len(BODY), "missing": missing}
    redis_up = "redis-server" not in missing and "redis" not in missing
    with redis_server() if redis_up else contextlib.nullcontext() as url:
        if url:
            extra["redis_version"] = redis_version(url)
        rows = run(parts, args, url, missing, extra)
    report("peers", rows, extra)


if __name__ == "__main__":
    main()
