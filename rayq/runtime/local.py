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


def stop_session(session_dir: str, address: str, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Stop every process of the Ray session in ``session_dir`` (its GCS, raylet,
    dashboard, agents and the workers under the raylet); returns how many."""
    procs = session_processes(session_dir)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _forget_current_cluster(session_dir, address)
    return len(procs)


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

