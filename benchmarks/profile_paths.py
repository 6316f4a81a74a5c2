"""Where rayq's time goes on one path of benchmarks/peers.py, process by process.

    python benchmarks/profile_paths.py e2e|send|tasks [--messages 200000] [--seconds 20]
                                       [--tasks 3000] [--out DIR]

Runs one workload of peers.py while py-spy samples the driver, every shard and every
consumer (100 Hz, non-blocking), then prints each process's top frames (self share of
its busy samples), the CPU every process spent per item, and the shard calls, commits
and consumer polls per 1 000 items. The collapsed stacks stay in --out for flame graphs.
Needs py-spy (`pip install -e '.[bench]'`) and the right to trace child processes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

import psutil
from ray import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from _report import cpu_by_process, report  # noqa: E402
from throughput import concurrent_sends, end_to_end, runtime  # noqa: E402

import rayq  # noqa: E402

TRACED = ("ray::ShardActor", "ray::ConsumerActor")
# peers.noop is a task of module "peers", which consumers may not import: send it by value
cloudpickle.register_pickle_by_value(peers)


def traced_processes() -> dict[int, str]:
    """pid -> name of this driver and of every shard and consumer process it started."""
    found = {os.getpid(): "driver"}
    for process in psutil.Process().children(recursive=True):
        try:
            title = process.cmdline()[0]
        except (psutil.Error, IndexError):
            continue
        for name in TRACED:
            if title.startswith(name):
                found[process.pid] = name.removeprefix("ray::")
    return found


def cpu_by_name() -> dict[tuple[str, int], float]:
    """:func:`cpu_by_process` less the py-spy recorders (the measuring, not the measured)."""
    return {key: s for key, s in cpu_by_process().items() if key[0] != "py-spy"}


def counters(client: rayq.Client) -> Counter:
    shards, consumers = client.stats(), client.consumer_stats()
    return Counter({"shard calls": sum(s.calls_committed for s in shards),
                    "shard commits": sum(s.commits for s in shards),
                    "consumer polls": sum(c.polls for c in consumers)})


def top_frames(path: str, n: int = 12) -> list[tuple[float, str]]:
    """(share of samples, frame) of the ``n`` frames most often at the top of the stack."""
    leaves, total = Counter(), 0
    with open(path) as stacks:
        for line in stacks:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            leaf = re.sub(r" \((?:/[^)]*?site-packages/|/[^)]*/(?=rayq/|actors/))?", " (",
                          stack.split(";")[-1])
            leaves[leaf] += int(count)
            total += int(count)
    return [(100 * k / total, frame) for frame, k in leaves.most_common(n)] if total else []


def workload(path: str, client: rayq.Client, args) -> tuple:
    """(run it, items it handles): the rayq side of one peers.py figure."""
    if path == "e2e":
        return lambda: end_to_end(client, args.messages), lambda rate: args.messages
    if path == "send":
        return lambda: concurrent_sends(args.seconds), lambda rate: rate * args.seconds
    return lambda: peers.rayq_tasks(client, args.tasks), lambda rate: args.tasks


def profiled(path: str, args, out_dir: str) -> tuple[list[dict], dict]:
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        sys.exit("py-spy is missing: pip install -e '.[bench]'")
    with runtime(rayq.Config(), prefix="rayq-profile-") as (client, _):
        run, items_of = workload(path, client, args)
        if path == "tasks":
            peers.rayq_tasks(client, 50)  # consumers running before the recording starts
        recorders = {pid: subprocess.Popen(
            [py_spy, "record", "--nonblocking", "-r", "100", "--format", "raw",
             "-o", os.path.join(out_dir, f"{name}-{pid}.txt"), "--pid", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for pid, name in traced_processes().items()}
        cpu0, calls0 = cpu_by_name(), counters(client)
        rate = run()
        cpu1, calls1 = cpu_by_name(), counters(client)
        for recorder in recorders.values():
            recorder.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
            recorder.wait(timeout=60)
    items = items_of(rate)
    cpu = defaultdict(float)
    for key, seconds in cpu1.items():
        cpu[key[0]] += seconds - cpu0.get(key, 0.0)
    rows = [{"figure": f"{path} rate", "value": rate, "unit": "items/s"}]
    rows += [{"figure": f"CPU per item: {name}", "value": s / items * 1e6, "unit": "µs"}
             for name, s in sorted(cpu.items(), key=lambda kv: -kv[1]) if s / items * 1e6 >= 1]
    rows += [{"figure": f"{what} per 1 000 items", "unit": "calls",
              "value": (calls1[what] - calls0[what]) / items * 1000} for what in calls1]
    frames = {f: top_frames(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    return rows, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", choices=("e2e", "send", "tasks"))
    parser.add_argument("--messages", type=int, default=200_000, help="e2e messages")
    parser.add_argument("--seconds", type=float, default=20.0, help="send x 8 duration")
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--out", help="where the collapsed stacks go (default: a new temp dir)")
    args = parser.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix=f"rayq-profile-{args.path}-")
    os.makedirs(out_dir, exist_ok=True)
    rows, frames = profiled(args.path, args, out_dir)
    for name, top in frames.items():
        print(f"\n{name}: top frames, share of busy samples")
        for share, frame in top:
            print(f"  {share:5.1f} %  {frame}")
    print(f"\ncollapsed stacks in {out_dir}")
    report(f"profile {args.path}", rows, {"out": out_dir, "top_frames": frames})


if __name__ == "__main__":
    main()
