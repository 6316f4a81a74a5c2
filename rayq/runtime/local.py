"""A Ray head on this machine that outlives one script: what ``rayq start`` and
``rayq stop`` run. The head listens on 127.0.0.1 only, like the embedded default.

``rayq stop`` stops this head's processes only (found by its session directory),
not every Ray on the machine as ``ray stop`` would.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import NamedTuple

import psutil

from rayq.runtime.session import LOOPBACK, SINGLE_MACHINE_ENV

STOP_TIMEOUT_S = 30.0


DASHBOARD_PORT = 8265  # Ray's own default


def free_port(wanted: int = 0) -> int:
    """``wanted`` if it is free on loopback right now, else a free port."""
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, wanted))
        except OSError:
            s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# The ports of a head's servers that Ray otherwise takes at fixed numbers (the dashboard
# agent's 52365, the Ray client server's 10001) or lets each server pick: chosen here,
# all free at once, so a second Ray on the machine neither takes nor loses them.
HEAD_PORTS = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
              "runtime-env-agent-port", "ray-client-server-port", "node-manager-port",
              "object-manager-port")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback right now (held open while chosen)."""
    held = [socket.socket() for _ in range(count)]
    try:
        for s in held:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def start_head(port: int, dashboard: bool) -> str:
    """``ray start --head`` on loopback, its GCS on ``port`` (0: a free one) and every
    other server on a free port; returns the address to attach to.

    Raises subprocess.CalledProcessError (with Ray's output) when it fails."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    *chosen, gcs = free_ports(len(HEAD_PORTS) + 1)
    port = port or gcs
    ports = [f"--{name}={number}" for name, number in zip(HEAD_PORTS, chosen)]
    cmd = [ray_cli, "start", "--head", f"--port={port}", f"--node-ip-address={LOOPBACK}",
           f"--dashboard-host={LOOPBACK}", f"--include-dashboard={str(dashboard).lower()}",
           f"--dashboard-port={free_port(DASHBOARD_PORT)}",  # ray start takes no busy one
           *ports, "--disable-usage-stats"]
    # Ray jobs' entrypoints (`python job.py`) run with this PATH: this interpreter first,
    # the one rayq and its packages are installed in.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, SINGLE_MACHINE_ENV: "0", "PATH": path}
    env.pop("RAY_ADDRESS", None)
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return f"{LOOPBACK}:{port}"


MARKER = "rayq-start"  # in a session directory: rayq start started this head


def mark_started(session_dir: str) -> None:
    with open(os.path.join(session_dir, MARKER), "w") as f:
        f.write(str(os.getpid()))


def started_by_rayq(session_dir: str) -> bool:
    return os.path.exists(os.path.join(session_dir, MARKER))


class Stopped(NamedTuple):
    """What stopping a session did: its processes, and how many of them had to be
    killed because they did not exit when told to."""

    processes: int
    killed: int


def stop_session(session_dir: str, address: str, timeout_s: float = STOP_TIMEOUT_S) -> Stopped:
    """Stop every process of the Ray session in ``session_dir`` (its GCS, raylet,
    dashboard, agents and the workers under the raylet)."""
    procs = session_processes(session_dir)
    killed, buckets = 0, _stop_order(procs)
    for bucket in buckets:
        for proc in bucket:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        for proc in _wait_exited(bucket, timeout_s / len(buckets)):
            try:
                proc.kill()
                killed += 1
            except psutil.NoSuchProcess:
                pass
    _forget_current_cluster(session_dir, address)
    return Stopped(len(procs), killed)


def _stop_order(procs: list[psutil.Process]) -> list[list[psutil.Process]]:
    """The raylet, then the rest, then the GCS, as ``ray stop`` orders them: a GCS told
    to stop while its raylet runs waits for it until it is killed."""
    def name(proc: psutil.Process) -> str:
        try:
            return proc.name()
        except psutil.NoSuchProcess:
            return ""
    first = [p for p in procs if name(p) == "raylet"]
    last = [p for p in procs if name(p) == "gcs_server"]
    return [first, [p for p in procs if p not in first and p not in last], last]


def _wait_exited(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited, for up to ``timeout_s``; the ones still
    running. A zombie has exited: the head's processes are orphans once ``ray start``
    returns, and where nothing reaps orphans (a container whose first process is not an
    init) they stay zombies, which ``psutil.wait_procs`` would wait for to the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [proc for proc in procs if _running(proc)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def session_processes(session_dir: str) -> list[psutil.Process]:
    """The processes started for a Ray session, and their children."""
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != me and any(session_dir in arg for arg in proc.info["cmdline"] or ()):
            found[proc.pid] = proc
            try:
                found.update((c.pid, c) for c in proc.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    found.pop(me, None)
    return list(found.values())


def _forget_current_cluster(session_dir: str, address: str) -> None:
    """Remove ``ray_current_cluster`` (what ``ray.init()`` attaches to) if it names this
    head, as ``ray stop`` does, so later scripts start their own Ray."""
    path = os.path.join(os.path.dirname(session_dir), "ray_current_cluster")
    try:
        with open(path) as f:
            if f.read().strip() == address:
                os.remove(path)
    except FileNotFoundError:
        pass

