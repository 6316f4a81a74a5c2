"""Replication on a simulated cluster (ray.cluster_utils.Cluster): three data nodes
n1, n2, n3, each shard a leader and a follower. Run as its own process by
tests/integration/test_replication.py, which names the modes to run one after
another on the same cluster; prints one JSON line per mode.

Modes:
- ``copies``: messages sent are on the follower's disk too, stats show the roles;
- ``node_kill``: senders run while a data node's raylet is killed and its folder
  deleted; every acknowledged message is received afterwards;
- ``pause``: a leader is paused (SIGSTOP) until the manager promotes its follower,
  then resumed: its later writes are refused and nothing acknowledged is lost;
- ``restart``: the runtime stopped and started again keeps its places, its followers
  in sync and every acknowledged message;
- ``grow``: two data nodes, four shards and three copies wanted; a third node joins
  while senders run, every shard gets a follower seeded there (a copy, then the write
  sets after it) that joins the in-sync set with the same rows as its leader, then
  the leadership of one shard moves there, and a new queue's subqueues land on it.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

import ray
from ray.cluster_utils import Cluster

import rayq
from actors.runtime import find_runtime
from rayq.client import Client
from actors import NAMESPACE, shard_name
from rayq.config import Config, ConsumerConfig, ScalingConfig, StoreConfig
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.codec.wire import encode_messages

NODES = ("n1", "n2", "n3")
SYSTEM = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
          "health_check_timeout_ms": 500, "health_check_failure_threshold": 4}


def add_node(cluster, name: str):
    return cluster.add_node(num_cpus=1, resources={"rayq_data": 1},
                            labels={"rayq-data-node": name})


def cluster_up(names=NODES):
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "_system_config": SYSTEM})
    nodes = {name: add_node(cluster, name) for name in names}
    ray.init(address=cluster.address, namespace="rayq", log_to_driver=False)
    return cluster, nodes


def start(data_dir: str, shards: int = 3, replicas: int = 2):
    config = Config(store=StoreConfig(shards=shards, replicas=replicas),
                    consumers=ConsumerConfig(count=0),
                    scaling=ScalingConfig(max_subqueues=shards))
    client = rayq.start(data_dir=data_dir, config=config)
    return client, client.create_queue("replicated", subqueues=shards, max_receives=None)


def drain(queue, expected: set, quiet_rounds: int = 25) -> set:
    """Receive (and delete) until every expected id came, or ``quiet_rounds`` in a row
    brought nothing."""
    received, quiet = set(), 0
    while quiet < quiet_rounds and not expected <= received:
        got = queue.receive(max_messages=100, wait_s=0.2)
        quiet = 0 if got else quiet + 1
        received.update(m.id for m in got)
        if got:
            queue.delete_batch([m.receipt for m in got])
    return received


def own_client() -> Client:
    """A client of the running runtime with a transport of its own (rayq.connect's
    clients of one credential share theirs)."""
    found = find_runtime()
    return Client(found["manager"], found["shards"], found["config"])


class Senders:
    """Threads sending batches for as long as ``running``; each acknowledged id kept,
    with when the last acknowledgement came (a send that fails is simply retried)."""

    def __init__(self, name: str, threads: int = 6):
        self.acked, self.errors = set(), 0
        self.lock, self.running = threading.Lock(), True
        self.acks_at: dict[int, list[float]] = {t: [] for t in range(threads)}
        # a client with a transport of its own each, as producers in processes of their
        # own have: the manager spreads their put subqueues over the shards
        self.queues = [own_client().queue(name) for _ in range(threads)]
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, t: int) -> None:
        n = 0
        while self.running:
            try:
                ids = self.queues[t].send_batch([rayq.Outgoing(f"{t}-{n}-{i}") for i in range(10)])
            except rayq.RayqError:
                with self.lock:
                    self.errors += 1
                time.sleep(0.05)
                continue
            n += 1
            with self.lock:
                self.acked.update(ids)
                self.acks_at[t].append(time.monotonic())

    def stop(self) -> None:
        self.running = False
        for t in self.threads:
            t.join(timeout=120)

    def shards(self) -> list[int]:
        """The shard each sender puts to."""
        return [q._transport.route(q.name).queue.subqueue(q._transport.route(q.name).target).shard
                for q in self.queues]

    def longest_wait_s(self, at: float) -> float | None:
        """The longest any sender went without an acknowledgement since ``at`` (a lost
        node's actors may serve on for a moment before they notice)."""
        with self.lock:
            waits = [max(b - a for a, b in zip([at] + later, later)) if later else None
                     for later in (sorted(x for x in acks if x > at)
                                   for acks in self.acks_at.values())]
        return None if None in waits else max(waits)


def folders(data_dir: str) -> dict:
    return {node: sorted(os.listdir(os.path.join(data_dir, node)))
            for node in NODES if os.path.isdir(os.path.join(data_dir, node))}


def copies(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(200)]))
    roles = {s.index: (s.node, s.role) for s in client.stats()}
    places = {k: [list(p.replicas), list(p.in_sync), p.epoch]
              for k, p in ray.get(ray.get_actor("rayq-manager").places.remote()).items()}
    applied = {k: ray.get(ray.get_actor(f"rayq-follower-{k}-{p[1][1]}").state.remote())[1]
               for k, p in places.items()}
    received = drain(queue, acked)
    return {"roles": roles, "places": places, "folders": folders(data_dir), "applied": applied,
            "acked": len(acked), "lost": len(acked - received)}


def wait_for_acks(senders, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(senders.acked) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def node_kill(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    senders = Senders("replicated")
    wait_for_acks(senders, 300)
    before, targets = len(senders.acked), senders.shards()
    lost_at = time.monotonic()
    cluster.remove_node(nodes["n2"], allow_graceful=False)
    shutil.rmtree(os.path.join(data_dir, "n2"))  # nothing of n2's can be reopened
    wait_for_acks(senders, len(senders.acked) + 300)
    deadline = time.monotonic() + 60  # until every sender was acknowledged since the loss
    while senders.longest_wait_s(lost_at) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    senders.stop()
    recovered_s = senders.longest_wait_s(lost_at)
    manager = ray.get_actor("rayq-manager")
    deadline = time.monotonic() + 180  # a new follower seeded for each shard n2 held a copy of
    while time.monotonic() < deadline and any(
            len(p.in_sync) < 2 or "n2" in p.in_sync for p in ray.get(manager.places.remote()).values()):
        time.sleep(0.5)
    places = {k: [list(p.replicas), list(p.in_sync), p.epoch]
              for k, p in ray.get(manager.places.remote()).items()}
    received = drain(queue, senders.acked)
    return {"acked_before": before, "acked": len(senders.acked),
            "lost": len(senders.acked - received), "places": places,
            "recovered_s": recovered_s, "send_errors": senders.errors, "targets": targets}


def pause(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(100)]))
    manager = ray.get_actor("rayq-manager")
    places = ray.get(manager.places.remote())
    shard = next(k for k, p in places.items() if p.leader != "n1")  # not the control node's
    old = ray.get_actor(shard_name(shard), namespace=NAMESPACE)
    route = queue._transport.route(queue.name)
    [sq] = [s.id for s in route.queue.subqueues if s.shard == shard]
    batch = encode_messages([NewMessage(encode_body("late", 1 << 20), "t", "k", "k")])
    acked |= set(ray.get(old.put.remote(sq, batch, auth=None)))  # the same write, acked now
    pid = ray.get(old.process.remote())["pid"]
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = ray.get(manager.places.remote())[shard]
        if now.epoch > places[shard].epoch and now.leader != places[shard].leader:
            break
        time.sleep(0.2)
    promoted = ray.get(manager.places.remote())[shard]
    acked |= set(queue.send_batch([rayq.Outgoing(i) for i in range(100, 300)]))
    os.kill(pid, signal.SIGCONT)
    # the old leader, resumed, must not acknowledge a write any more
    try:
        ray.get(old.put.remote(sq, batch, auth=None), timeout=30)
        old_write = "acknowledged"
    except Exception as err:  # StaleEpoch, or the actor was killed for good
        old_write = f"refused: {type(err).__name__}"
    acked |= set(queue.send_batch([rayq.Outgoing(i) for i in range(300, 400)]))
    received = drain(queue, acked)
    return {"old_leader": places[shard].leader, "new_leader": promoted.leader,
            "epochs": [places[shard].epoch, promoted.epoch], "old_write": old_write,
            "acked": len(acked), "lost": len(acked - received)}


def restart(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(300)]))
    before = {k: [list(p.in_sync), p.epoch]
              for k, p in ray.get(ray.get_actor("rayq-manager").places.remote()).items()}
    rayq.shutdown()
    client, queue = start(data_dir)
    acked |= set(queue.send_batch([rayq.Outgoing(i) for i in range(300, 400)]))
    time.sleep(3.0)  # a follower found out of sync would have been taken out by now
    after = {k: [list(p.in_sync), p.epoch]
             for k, p in ray.get(ray.get_actor("rayq-manager").places.remote()).items()}
    received = drain(queue, acked)
    return {"before": before, "after": after, "acked": len(acked),
            "lost": len(acked - received)}


def rows(folder: str) -> int:
    """Rows in the LMDB store at ``folder`` (read-only, beside the running shard)."""
    import lmdb

    env = lmdb.open(folder, readonly=True, lock=False, max_dbs=20)
    try:
        with env.begin() as txn:
            return txn.stat(env.open_db(b"rows", txn=txn, create=False))["entries"]
    finally:
        env.close()


def grow(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir, shards=4, replicas=3)
    manager = ray.get_actor("rayq-manager")
    before = {k: list(p.in_sync) for k, p in ray.get(manager.places.remote()).items()}
    senders = Senders("replicated", threads=2)
    wait_for_acks(senders, 200)
    add_node(cluster, "n3")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        places = ray.get(manager.places.remote())
        if all("n3" in p.in_sync for p in places.values()):
            break
        time.sleep(0.5)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # then n3 takes over the lead of a shard
        places = ray.get(manager.places.remote())
        if any(p.leader == "n3" for p in places.values()):
            break
        time.sleep(0.5)
    wait_for_acks(senders, len(senders.acked) + 200)
    senders.stop()
    time.sleep(2.0)
    places = ray.get(manager.places.remote())
    spread = client.create_queue("spread-out", subqueues=4, max_receives=None)
    spread_nodes = sorted(places[sq.shard].leader
                          for sq in client.transport.route("spread-out")[0].subqueues)
    spread.send("x")
    counts = {k: {n: rows(os.path.join(data_dir, n, f"shard-{k}")) for n in p.in_sync}
              for k, p in places.items()}
    received = drain(queue, senders.acked)
    return {"before": before, "after": {k: [list(p.in_sync), p.epoch] for k, p in places.items()},
            "leaders": {k: p.leader for k, p in places.items()}, "spread": spread_nodes,
            "rows": counts, "acked": len(senders.acked), "lost": len(senders.acked - received)}


MODES = {"copies": copies, "node_kill": node_kill, "pause": pause, "grow": grow,
         "restart": restart}


def run(mode: str, cluster, nodes) -> dict:
    """One scenario on its own runtime and data directory, stopped afterwards."""
    data_dir = tempfile.mkdtemp(prefix=f"rayq-replication-{mode}-")
    try:
        return MODES[mode](cluster, nodes, data_dir)
    finally:
        rayq.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    """Run the scenarios named on the command line, in order, on one cluster (``grow``
    needs one of two data nodes, the others one of three; ``node_kill`` removes n2, so
    it comes last); prints a JSON line per scenario done. Exits 1 when one failed."""
    modes = sys.argv[1:]
    assert modes and ("grow" not in modes or modes == ["grow"]), modes
    assert "node_kill" not in modes[:-1], "node_kill removes a node: it runs last"
    cluster, nodes = cluster_up(NODES[:2] if modes == ["grow"] else NODES)
    failed = False
    try:
        for mode in modes:
            try:
                result = run(mode, cluster, nodes)
            except Exception:
                traceback.print_exc()
                failed = True
                continue
            print(json.dumps({"mode": mode, "result": result}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
