"""Replication on a simulated cluster (ray.cluster_utils.Cluster): three data nodes
n1, n2, n3, each shard a leader and a follower. Run as its own process by
tests/integration/test_replication.py, which names the modes to run one after
another on the same cluster; prints one JSON line per mode.

Modes:
- ``copies``: messages sent are on the follower's disk too, stats show the roles;
- ``node_kill``: senders run while a data node's raylet is killed and its folder
  deleted; every acknowledged message is received afterwards, and tasks submitted
  before the loss (refs pending on every shard) resolve to their values, by ref and
  by id;
- ``pause``: a leader is paused (SIGSTOP) until the manager promotes its follower,
  then resumed: its later writes are refused and nothing acknowledged is lost;
- ``stopped``: a shard's leader and its in-sync follower are both stopped for good, as
  a failover cut short leaves them; the shard is led again from the copy on disk;
- ``restart``: the runtime stopped and started again keeps its places, its followers
  in sync and every acknowledged message;
- ``control_loss``: the control node is removed with its folder while senders run;
  the control stores fail over by themselves, then a node joins under its name with an
  empty folder and the runtime is started again: nothing is lost or reused, and an
  account's schedules are kept and fired by the manager that took over;
- ``grow``: two data nodes, four shards and three copies wanted; a third node joins
  while senders run, every shard gets a follower seeded there (a copy, then the write
  sets after it) that joins the in-sync set with the same rows as its leader, then
  the leadership of one shard moves there, and a new queue's subqueues land on it.
"""

import contextlib
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
from actors.controlstore import current_place
from actors.lifecycle import find_runtime, runtime_stopped
from rayq.client import Client
from rayq.names import namespace, shard_name
from actors.replication.leader import follower_name
from rayq.config import Config, ConsumerConfig, ScalingConfig, StoreConfig
from rayq.core.kit.clock import FakeClock
from rayq.errors import RuntimeFailure
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


_began = [time.monotonic(), ""]  # when the running scenario began, and its name


def step(what: str) -> None:
    """Note on stderr how far the running scenario got, and when: a failing test shows
    where it stopped, and a slow one where its time went."""
    print(f"[{_began[1]} +{time.monotonic() - _began[0]:.1f}s] {what}", file=sys.stderr,
          flush=True)


def start(data_dir: str, shards: int = 3, replicas: int = 2):
    config = Config(store=StoreConfig(shards=shards, replicas=replicas),
                    consumers=ConsumerConfig(count=0),
                    scaling=ScalingConfig(max_subqueues=shards))
    client = rayq.start(data_dir=data_dir, config=config)
    step("runtime started")
    return client, client.create_queue("replicated", subqueues=shards, max_receives=None)


def drain(queue, expected: set, quiet_rounds: int = 25, visibility_timeout_s: float = 30.0
          ) -> set:
    """Receive (and delete) until every expected id came, or ``quiet_rounds`` in a row
    brought nothing."""
    received, quiet = set(), 0
    while quiet < quiet_rounds and not expected <= received:
        got = queue.receive(max_messages=100, wait_s=0.2, visibility_timeout_s=visibility_timeout_s)
        quiet = 0 if got else quiet + 1
        received.update(m.id for m in got)
        if got:
            queue.delete_batch([m.receipt for m in got])
    step(f"drained {len(received & expected)} of {len(expected)} at line "
         f"{sys._getframe(1).f_lineno}")
    return received


def own_client() -> Client:
    """A client of the running runtime with a transport of its own (rayq.connect's
    clients of one credential share theirs)."""
    found = find_runtime()
    return Client(found["manager"], found["shards"], found["config"])


class Senders:
    """Threads sending batches for as long as ``running``; each acknowledged id kept,
    with when the last acknowledgement came (a send that fails is simply retried)."""

    def __init__(self, name: str, threads: int = 6, client=None, prefix: str = ""):
        self.acked, self.errors, self.prefix = set(), 0, prefix
        self.lock, self.running = threading.Lock(), True
        self.acks_at: dict[int, list[float]] = {t: [] for t in range(threads)}
        # a client with a transport of its own each, as producers in processes of their
        # own have: the manager spreads their put subqueues over the shards
        self.queues = [(client or own_client)().queue(name) for _ in range(threads)]
        self.threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, t: int) -> None:
        n = 0
        while self.running:
            try:
                ids = self.queues[t].send_batch([rayq.Outgoing(f"{self.prefix}{t}-{n}-{i}")
                                                 for i in range(10)])
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
              for k, p in shard_places().items()}
    followers = {k: ray.get_actor(f"rayq-follower-{k}-{p[1][1]}") for k, p in places.items()}
    applied = {k: ray.get(f.state.remote())[1] for k, f in followers.items()}
    received = drain(queue, acked)
    return {"roles": roles, "places": places, "folders": folders(data_dir), "applied": applied,
            "applies": {k: ray.get(f.applies.remote()) for k, f in followers.items()},
            "acked": len(acked), "lost": len(acked - received)}


def wait_for_acks(senders, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(senders.acked) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    step(f"{len(senders.acked)} of {count} acknowledged at line {sys._getframe(1).f_lineno}")


@rayq.task(type="triple")
def triple(x):
    return 3 * x


TASK_IDS = [f"order-{i}" for i in range(12)]


def node_kill(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    # tasks pending on every shard (their ids spread them; no consumer runs yet)
    client.create_queue("tasks", subqueues=3)
    refs = [client.submit(triple, i, task_id=task_id) for i, task_id in enumerate(TASK_IDS)]
    task_shards = sorted({client._tasks.find(task_id)[0] for task_id in TASK_IDS})
    senders = Senders("replicated")
    wait_for_acks(senders, 300)
    before, targets = len(senders.acked), senders.shards()
    lost_at = time.monotonic()
    cluster.remove_node(nodes["n2"], allow_graceful=False)
    remove_folder(os.path.join(data_dir, "n2"))  # nothing of n2's can be reopened
    wait_for_acks(senders, len(senders.acked) + 300)
    deadline = time.monotonic() + 60  # until every sender was acknowledged since the loss
    while senders.longest_wait_s(lost_at) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    senders.stop()
    recovered_s = senders.longest_wait_s(lost_at)
    deadline = time.monotonic() + 180  # a new follower seeded for each shard n2 held a copy of
    while time.monotonic() < deadline and any(
            len(p.in_sync) < 2 or "n2" in p.in_sync for p in shard_places().values()):
        time.sleep(0.5)
    places = {k: [list(p.replicas), list(p.in_sync), p.epoch]
              for k, p in shard_places().items()}
    received = drain(queue, senders.acked)
    client.scale_consumers(1)
    step("consumers started for the pending tasks")
    values = ray.get(refs, timeout=300)
    by_id = [client.result(task_id, timeout_s=60) for task_id in TASK_IDS]
    return {"acked_before": before, "acked": len(senders.acked),
            "lost": len(senders.acked - received), "places": places,
            "recovered_s": recovered_s, "send_errors": senders.errors, "targets": targets,
            "task_shards": task_shards, "task_values": values, "task_results": by_id}


def pause(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(100)]))
    places = shard_places()
    shard = next(k for k, p in places.items() if p.leader != "n1")  # not the control node's
    old = ray.get_actor(shard_name(shard), namespace=namespace())
    route = queue._transport.route(queue.name)
    [sq] = [s.id for s in route.queue.subqueues if s.shard == shard]
    batch = encode_messages([NewMessage(encode_body("late", 1 << 20), "t", "k", "k")])
    acked |= set(ray.get(old.put.remote(sq, batch, auth=None)))  # the same write, acked now
    pid = ray.get(old.process.remote())["pid"]
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = shard_places()[shard]
        if now.epoch > places[shard].epoch and now.leader != places[shard].leader:
            break
        time.sleep(0.2)
    promoted = shard_places()[shard]
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


def stopped(cluster, nodes, data_dir) -> dict:
    """Shard 0's leader and its in-sync follower are killed for good (a failover whose
    manager was replaced between stopping the old leader and starting the new one leaves
    them so): the manager starts the follower again on its copy, promotes it, and every
    acknowledged message is received."""
    client, queue = start(data_dir)
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(200)]))
    before = shard_places()[0]
    for name in (shard_name(0), follower_name(0, before.in_sync[1])):
        ray.kill(ray.get_actor(name, namespace=namespace()), no_restart=True)
    led_again = wait_for(lambda: shard_places()[0].epoch > before.epoch, 120)
    acked |= set(queue.send_batch([rayq.Outgoing(i) for i in range(200, 300)]))
    received = drain(queue, acked)
    after = shard_places()[0]
    return {"before": [list(before.in_sync), before.epoch], "led_again": led_again,
            "after": [list(after.in_sync), after.epoch], "acked": len(acked),
            "lost": len(acked - received)}


def restart(cluster, nodes, data_dir) -> dict:
    client, queue = start(data_dir)
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(300)]))
    before = {k: [list(p.in_sync), p.epoch]
              for k, p in shard_places().items()}
    rayq.shutdown()
    stopped_at_once = not_waited_for()
    client, queue = start(data_dir)
    acked |= set(queue.send_batch([rayq.Outgoing(i) for i in range(300, 400)]))
    time.sleep(3.0)  # a follower found out of sync would have been taken out by now
    after = {k: [list(p.in_sync), p.epoch]
             for k, p in shard_places().items()}
    received = drain(queue, acked)
    return {"before": before, "after": after, "acked": len(acked),
            "lost": len(acked - received), "stopped_at_once": stopped_at_once}


class OneLook(FakeClock):
    """A frozen clock that fails a caller reading it a third time: finding a runtime
    while waiting for its manager to fail over reads it on every round of the wait."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        if self.reads > 2:
            raise AssertionError("waited for a manager to fail over")
        return super().monotonic()


def not_waited_for() -> bool:
    """Whether a runtime just stopped is found stopped at once: its manager's place
    stays claimed (the next start follows it), but no manager is coming back."""
    with contextlib.suppress(RuntimeFailure):
        find_runtime(OneLook())
        return False  # found running
    return current_place("manager") is not None and runtime_stopped()


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
    before = {k: list(p.in_sync) for k, p in shard_places().items()}
    senders = Senders("replicated", threads=2)
    wait_for_acks(senders, 200)
    nodes["n3"] = add_node(cluster, "n3")  # the scenarios after grow run on three nodes
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        places = shard_places()
        if all("n3" in p.in_sync for p in places.values()):
            break
        time.sleep(0.5)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # then n3 takes over the lead of a shard
        places = shard_places()
        if any(p.leader == "n3" for p in places.values()):
            break
        time.sleep(0.5)
    wait_for_acks(senders, len(senders.acked) + 200)
    senders.stop()
    time.sleep(2.0)
    places = shard_places()
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


def shard_places() -> dict:
    """Every shard's place, from the manager that runs now: looked up by name each time,
    as the manager may move while a scenario runs (a loaded machine)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return ray.get(ray.get_actor("rayq-manager").places.remote(), timeout=30)
        except (ValueError, ray.exceptions.RayError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def control_places() -> dict:
    from actors.controlstore import every_place

    return {store: [list(p.in_sync), p.epoch] for store, p in every_place().items()}


def remove_folder(path: str) -> None:
    """Delete a lost node's folder: its processes may write a moment after the node is
    removed, so what they leave is removed again."""
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(0.5)


def answers(name: str) -> bool:
    try:
        return bool(ray.get(ray.get_actor(name).ping.remote(), timeout=5))
    except (ValueError, ray.exceptions.RayError):
        return False


def manager_answers() -> bool:
    return answers("rayq-manager")


def files_private(data_dir: str) -> bool | str:
    """True when every folder and file under ``data_dir`` is its owner's alone, else why not."""
    from rayq.core.kit.private import check_private_dir

    try:
        check_private_dir(data_dir)
        return True
    except rayq.RayqError as err:
        return str(err)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            step(f"waited at line {sys._getframe(1).f_lineno}")
            return True
        time.sleep(0.2)
    step(f"gave up waiting at line {sys._getframe(1).f_lineno}")
    return False


def control_loss(cluster, nodes, data_dir) -> dict:
    """The control node (n1: first by name) is removed without warning and its folder
    deleted while senders run; nobody runs a command. Then a node joins under n1's name
    with an empty folder, and the runtime is stopped and started again."""
    client, queue = start(data_dir, shards=2)
    key = client.create_account("acme")
    acme = rayq.connect(account="acme", key=key)
    orders = acme.create_queue("orders", max_receives=None)
    acme_acked = set(orders.send_batch([rayq.Outgoing(i) for i in range(40)]))
    client.suspend("export", reason="maintenance", by="ops")
    rayq.serve_sqs(port=free_port())  # its state's store is a control store too
    sqs_settings = {"attributes": {"VisibilityTimeout": "45"}}
    ray.get(ray.get_actor("rayq-sqs-state").save.remote("acme", "orders", sqs_settings))
    client.register(triple)  # handlers are the admin's to register
    acme.schedule("yearly", triple, 1, cron="0 0 1 1 *")
    acme.schedule("beat", triple, 2, every_s=1)
    # every control store in sync on two nodes before the loss
    in_sync = wait_for(lambda: all(len(p[0]) >= 2 for p in control_places().values())
                       and len(control_places()) == 4)
    before = control_places()
    private = files_private(data_dir)  # every copy, seeded ones too, as private as the rest
    senders = Senders("replicated", threads=4)
    wait_for_acks(senders, 200)
    targets = senders.shards()
    leaders = {k: p.leader for k, p in shard_places().items()}
    lost_at, lost_wall = time.monotonic(), time.time()
    cluster.remove_node(nodes["n1"], allow_graceful=False)
    remove_folder(os.path.join(data_dir, "n1"))  # nothing of n1's can be reopened
    wait_for_acks(senders, len(senders.acked) + 300)
    wait_for(lambda: senders.longest_wait_s(lost_at) is not None, 120)
    recovered_s = senders.longest_wait_s(lost_at)
    moved = wait_for(lambda: len(control_places()) == 4 and
                     all(p[0][0] != "n1" for p in control_places().values()), 120)
    wait_for(manager_answers, 60)
    after = control_places()
    # the registry, accounts, keys and rules, as the new control actors read them
    acme = rayq.connect(account="acme", key=key)
    wait_for(lambda: answers("rayq-sqs-state"), 60)
    after_loss = {"queues": sorted(client.list_queues()), "acme_queues": acme.list_queues(),
                  "suspended": [getattr(r, "key", r) for r in client.fairness().suspended],
                  "sqs_settings": ray.get(ray.get_actor("rayq-sqs-state").settings.remote(
                      "acme", "orders")) == sqs_settings,
                  "acme_schedules": [s.name for s in acme.schedules()]}
    # the manager that took over fires acme's schedule: a tick after the loss
    ticked = wait_for(lambda: next(s.last_fired_at or 0 for s in acme.schedules()
                                   if s.name == "beat") > lost_wall, 180)
    acme.unschedule("beat")
    senders.stop()
    received = drain(queue, senders.acked)
    acme_received = drain(acme.queue("orders"), acme_acked)
    # a node joins under n1's name with an empty folder; the runtime starts again
    nodes["n1"] = add_node(cluster, "n1")
    rayq.shutdown()
    client, queue = start(data_dir, shards=2)
    restarted = control_places()
    acme = rayq.connect(account="acme", key=key)
    late = set(acme.queue("orders").send_batch([rayq.Outgoing(i) for i in range(10)]))
    fresh = client.create_queue("fresh", max_receives=None)  # its ids are new ones
    fresh_got = fresh.receive(max_messages=10, wait_s=0.5)
    return {"in_sync_before": in_sync, "before": before, "after": after, "moved": moved,
            "restarted": restarted, "recovered_s": recovered_s, "after_loss": after_loss,
            "after_restart": {"queues": sorted(client.list_queues()),
                              "acme_queues": acme.list_queues(),
                              "acme_schedules": [s.name for s in acme.schedules()]},
            "ticked_after_loss": ticked,
            "acked": len(senders.acked), "lost": len(senders.acked - received),
            "acme_lost": len(acme_acked - acme_received),
            "late_lost": len(late - drain(acme.queue("orders"), late)),
            "fresh_got": len(fresh_got), "targets": targets, "private": private,
            "leaders_before": {str(k): v for k, v in leaders.items()}}


def control_pause(cluster, nodes, data_dir) -> dict:
    """The manager is paused (SIGSTOP) until a copy of its store leads elsewhere, then
    resumed: it changes nothing (it was stopped for good, or its writes are refused)."""
    from ray.util.state import list_actors

    client, queue = start(data_dir, shards=2)
    wait_for(lambda: len(control_places()) >= 3 and
             all(len(p[0]) >= 2 for p in control_places().values()))
    before = control_places()["manager"]
    [old] = list_actors(address=own_gcs(), detail=True,
                        filters=[("name", "=", "rayq-manager"), ("state", "=", "ALIVE")])
    acked = set(queue.send_batch([rayq.Outgoing(i) for i in range(100)]))
    os.kill(old.pid, signal.SIGSTOP)
    moved = wait_for(lambda: control_places()["manager"][1] > before[1], 120)
    wait_for(manager_answers, 60)
    client = own_client()
    client.create_queue("after-pause", max_receives=None)
    acked |= set(client.queue("replicated").send_batch([rayq.Outgoing(i) for i in range(100)]))
    try:
        os.kill(old.pid, signal.SIGCONT)
        resumed = "resumed"
    except ProcessLookupError:
        resumed = "gone"
    time.sleep(3.0)  # what a resumed old manager would do, it would have begun
    after = control_places()["manager"]
    queues = sorted(own_client().list_queues())
    received = drain(client.queue("replicated"), acked)
    return {"before": before, "after": after, "moved": moved, "resumed": resumed,
            "queues": queues, "acked": len(acked), "lost": len(acked - received)}


def drain_node(cluster, nodes, data_dir) -> dict:
    """The node leading the manager's store is drained while senders run, then removed
    with its folder: nothing fails over at its removal, and nothing is lost."""
    client, queue = start(data_dir, shards=3)
    wait_for(lambda: len(control_places()) >= 3 and
             all(len(p[0]) >= 2 for p in control_places().values()))
    node = control_places()["manager"][0][0]
    senders = Senders("replicated", threads=4)
    wait_for_acks(senders, 200)
    left = client.drain(node, wait_s=300)
    wait_for(manager_answers, 60)
    drained_shards = {k: [list(p.replicas), p.epoch] for k, p in shard_places().items()}
    drained_control = control_places()
    wait_for_acks(senders, len(senders.acked) + 200)
    cluster.remove_node(nodes[node], allow_graceful=False)
    remove_folder(os.path.join(data_dir, node))
    removed_at = time.monotonic()
    wait_for_acks(senders, len(senders.acked) + 300)
    wait_for(lambda: senders.longest_wait_s(removed_at) is not None, 120)
    time.sleep(3.0)  # a failover the removal caused would have begun by now
    after_shards = {k: [list(p.replicas), p.epoch] for k, p in shard_places().items()}
    after_control = control_places()
    senders.stop()
    received = drain(queue, senders.acked)
    nodes[node] = add_node(cluster, node)  # back, empty, for the scenarios after
    return {"node": node, "left": left, "drained_shards": drained_shards,
            "after_shards": after_shards, "drained_control": drained_control,
            "after_control": after_control, "acked": len(senders.acked),
            "lost": len(senders.acked - received)}


VISIBILITY_S = 5.0  # a message received but not deleted (a failover) comes back this soon


class Receivers:
    """Threads receiving (and deleting) from each of ``queues`` (name -> queue) for as
    long as ``running``: every delivery counted by id, and each checked to be one of
    that queue's own messages (its body starts with the queue's prefix)."""

    def __init__(self, queues: dict):
        self.deliveries: dict[str, int] = {}
        self.foreign: list[str] = []
        self.lock, self.running = threading.Lock(), True
        self.threads = [threading.Thread(target=self._run, args=(prefix, queue))
                        for prefix, queue in queues.items()]
        for t in self.threads:
            t.start()

    def _run(self, prefix: str, queue) -> None:
        while self.running:
            try:
                got = queue.receive(max_messages=100, wait_s=0.2,
                                    visibility_timeout_s=VISIBILITY_S)
            except rayq.RayqError:
                time.sleep(0.1)
                continue
            with self.lock:  # delivered, whether or not the delete below goes through
                for m in got:
                    self.deliveries[m.id] = self.deliveries.get(m.id, 0) + 1
                    if not str(m.body).startswith(prefix):
                        self.foreign.append(m.id)
            try:
                if got:
                    queue.delete_batch([m.receipt for m in got])
            except rayq.RayqError:
                pass  # a shard failing over: they come back after VISIBILITY_S

    def stop(self) -> None:
        self.running = False
        for t in self.threads:
            t.join(timeout=120)


def healed(copies: int = 2) -> bool:
    """Every shard and control store back to ``copies`` in sync, and the manager answers."""
    try:
        shards = ray.get(ray.get_actor("rayq-manager").places.remote(), timeout=10)
    except (ray.exceptions.RayError, ValueError):
        return False
    return all(len(p.in_sync) >= copies for p in shards.values()) and \
        len(control_places()) >= 3 and all(len(p[0]) >= copies for p in control_places().values())


def node_pids(node_id: str) -> list[int]:
    from ray.util.state import list_actors

    return [a.pid for a in list_actors(address=own_gcs(), filters=[("state", "=", "ALIVE")],
                                       detail=True, limit=1000)
            if a.node_id == node_id and (a.name or "").startswith("rayq-")]


def own_gcs() -> str:
    """This cluster's address: the state API asks it, not whichever Ray on this machine
    started last (a test run's own Ray runs beside this one)."""
    return ray.get_runtime_context().gcs_address


def nemesis(cluster, nodes, data_dir, rounds: int = 3, seed: int = 7) -> dict:
    """Senders of two accounts and receivers run while, one at a time, a data node is
    killed and brought back empty, or has every rayq process on it paused a while; the
    runtime heals between rounds. Nothing acknowledged may be lost, nothing delivered to
    another queue or account; each message's deliveries are counted."""
    import random

    rng = random.Random(seed)
    client, queue = start(data_dir, shards=3)
    key = client.create_account("acme")
    acme = lambda: rayq.connect(account="acme", key=key)  # noqa: E731
    acme().create_queue("orders", subqueues=2, max_receives=None)
    senders = [Senders("replicated", threads=2, prefix="replicated:"),
               Senders("orders", threads=2, client=acme, prefix="orders:")]
    receivers = Receivers({"replicated:": own_client().queue("replicated"),
                           "orders:": acme().queue("orders")})
    done = []
    for _ in range(rounds):
        wait_for(healed, 240)
        name, action = rng.choice(sorted(nodes)), rng.choice(("kill", "pause"))
        if action == "kill":
            cluster.remove_node(nodes[name], allow_graceful=False)
            remove_folder(os.path.join(data_dir, name))
            time.sleep(5.0)  # the runtime works without it for a while
            nodes[name] = add_node(cluster, name)  # back under its name, empty
        else:
            pids = node_pids(nodes[name].node_id)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(10.0)  # long enough to be taken for lost
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass  # replaced meanwhile: killed for good
        done.append([name, action, control_places().get("manager"), sorted(
            own_client().list_queues())])
    healed_at_end = wait_for(healed, 240)
    for s in senders:
        s.stop()
    time.sleep(2.0)
    receivers.stop()
    acked = senders[0].acked | senders[1].acked
    # what the receivers took but could not delete shows again after VISIBILITY_S: the
    # quiet rounds outlast it
    quiet = int(3 * VISIBILITY_S / 0.2)
    left = drain(own_client().queue("replicated"), senders[0].acked - set(receivers.deliveries),
                 quiet, VISIBILITY_S)
    left |= drain(acme().queue("orders"), senders[1].acked - set(receivers.deliveries),
                  quiet, VISIBILITY_S)
    delivered = set(receivers.deliveries) | left
    return {"rounds": done, "healed": healed_at_end, "acked": len(acked),
            "lost": len(acked - delivered), "foreign": len(receivers.foreign),
            "redelivered": sum(1 for n in receivers.deliveries.values() if n > 1),
            "unacked_delivered": len(set(receivers.deliveries) - acked)}


MODES = {"copies": copies, "nemesis": nemesis, "control_loss": control_loss, "drain": drain_node,
         "control_pause": control_pause, "node_kill": node_kill, "pause": pause, "grow": grow,
         "restart": restart, "stopped": stopped}


def run(mode: str, cluster, nodes) -> dict:
    """One scenario on its own runtime and data directory, stopped afterwards."""
    data_dir = tempfile.mkdtemp(prefix=f"rayq-replication-{mode}-")
    started = _began[0] = time.monotonic()
    _began[1] = mode
    try:
        return {**MODES[mode](cluster, nodes, data_dir), "seconds": time.monotonic() - started}
    finally:
        step("done; stopping the runtime")
        rayq.shutdown()
        step("runtime stopped")
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    """Run the scenarios named on the command line, in order, on one cluster (``grow``
    starts on two data nodes and adds the third the others need; ``node_kill`` removes
    n2, so it comes last); prints a JSON line per scenario done. Exits 1 when one failed."""
    modes = sys.argv[1:]
    assert modes and "grow" not in modes[1:], "grow starts on two nodes and adds the third"
    assert "node_kill" not in modes[:-1], "node_kill removes a node: it runs last"
    cluster, nodes = cluster_up(NODES[:2] if modes[0] == "grow" else NODES)
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
