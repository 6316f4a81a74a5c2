"""Starting, finding and stopping the runtime's named actors (namespace ``rayq``)."""

from __future__ import annotations

import time

import ray
import ray.experimental.internal_kv as internal_kv

from rayq.names import MANAGER, consumer_name, namespace, shard_name
from actors.control import control_starter
from actors.controlstore import CONTROL_FOLLOWER_PREFIX, current_place, forget_place
from actors.base import shard_handles
from actors.data_nodes import copies_on_disk, data_nodes, publish, published_places
from actors.replication.keeper import start_followers, start_shard
from actors.replication.leader import FOLLOWER_PREFIX
from rayq.config import Config
from rayq.core.control.control_places import SQS_STORE
from rayq.core.control.placement import (DataNode, default_replicas, plan_shards, shard_count,
                                          shard_indexes)
from rayq.core.replication.shard_places import LOCAL_NODE, ShardPlace
from rayq.core.replication.shard_places import (recovered_shards, reusable, trusted_shard,
                                                with_followers)
from rayq.core.kit.clock import Clock, SystemClock
from rayq.errors import RuntimeFailure
from rayq.remote import NO_RETRY, actor_names, call, manager_handle, running

FAILOVER_WAIT_S = 60.0  # how long finding the runtime waits for a manager failing over
# In Ray's GCS, per runtime: set while the runtime is stopped on purpose (rayq.shutdown,
# `rayq stop`), when the manager's place stays claimed but no manager is coming back
STOPPED_KEY = b"rayq/stopped"


def plan(nodes: list[DataNode], data_dir: str, config: Config) -> dict[int, ShardPlace]:
    """Every shard's place: as published (the manager keeps it while the cluster
    lives) but led by an in-sync copy that applied the most; else (the cluster
    restarted) rebuilt from the copies on the disks, the one that applied most
    leading; else where its files are or spread, with followers round the ring.
    The shards are the configured ones and every one scaling added, which a data node's
    disk holds a copy of (:func:`~rayq.core.control.placement.shard_count`)."""
    held = copies_on_disk(nodes, data_dir)  # one look at every node's folder serves all
    on_disk = {node: shard_indexes(list(found)) for node, found in held.items()}
    shards = shard_count(on_disk, config.store.shards)
    # published by a runtime of this name; reused only when they place exactly these
    # shards (another data directory's runtime of more or fewer shards is planned anew)
    places = published_places()
    if reusable(places, shards, {n.name for n in nodes}):
        # the embedded runtime keeps one copy: nothing recorded to compare; elsewhere a
        # node back under a known name with an empty or older folder leads nothing
        held = {} if nodes[0].name == LOCAL_NODE else held
        return {shard: trusted_shard(place, {n: held.get(n, {}).get(f"shard-{shard}")
                                             for n in place.in_sync})
                for shard, place in places.items()}
    leaders = plan_shards(nodes, on_disk, shards)
    copies = config.store.replicas or default_replicas(len(nodes))
    return {**with_followers(leaders, [n.name for n in nodes], copies),
            **recovered_shards(held, shards)}


def _ready(handles: list) -> list:
    """``handles`` once each answers (an actor that cannot start fails the start at once)."""
    for handle in handles:
        call(lambda handle=handle: handle.ping.remote(), NO_RETRY)
    return handles


def ensure_runtime(data_dir: str, config: Config, consumers: int | None = None) -> dict:
    """Create the shards, the control actors and the consumers unless they run already.

    Shards spread over the data nodes (docs/replication.md), each pinned to its
    node and keeping its files in that node's folder of ``data_dir``; a shard
    whose files a node already holds starts there again. With more than one copy
    its followers start first, on the next nodes. Each control actor starts where its
    store's place leads (claimed in Ray's GCS, else found on the disks, else the first
    data node by name), with a control follower on every data node. ``consumers``
    sets how many consumer actors run; None keeps the number a previous run chose (or
    the configured one). Returns the handles."""
    nodes = data_nodes(config)
    by_name = {n.name: n for n in nodes}
    places = plan(nodes, data_dir, config)
    publish(places)
    for follower in start_followers(places, nodes, data_dir, config):  # before their leaders
        call(lambda follower=follower: follower.state.remote(), NO_RETRY)
    shards = _ready([start_shard(i, by_name[place.leader], data_dir, config)
                     for i, place in sorted(places.items())])
    control = control_starter(nodes, data_dir, config)
    # each after the ones it finds at start: the manager the shards, the others both
    [manager] = _ready([control("manager")])
    internal_kv._internal_kv_del(STOPPED_KEY, namespace=namespace())
    [coordinator, _] = _ready([control("coordinator"), control("flood")])
    call(lambda: manager.scale_consumers.remote(consumers))
    return {"manager": manager, "shards": shards, "coordinator": coordinator}


def find_runtime(clock: Clock = SystemClock()) -> dict:
    """Handles of a running runtime. Raises RuntimeFailure when none runs. While the
    manager fails over (its store is placed, its actor not yet started again, and the
    runtime was not stopped) this waits up to FAILOVER_WAIT_S for it."""
    failing_over = current_place("manager") is not None and not runtime_stopped()
    deadline = clock.monotonic() + (FAILOVER_WAIT_S if failing_over else 0.0)
    while True:
        try:
            manager = manager_handle()
            break
        except ValueError as err:
            if clock.monotonic() >= deadline:
                raise RuntimeFailure("no rayq runtime is running in this Ray cluster; "
                                     "call rayq.start() first") from err
            time.sleep(0.2)
    config = call(lambda: manager.config_value.remote())
    return {"manager": manager, "shards": shard_handles(config, config.store.local_channel),
            "config": config}


def runtime_stopped() -> bool:
    """Whether this runtime was stopped on purpose and not started since."""
    return internal_kv._internal_kv_exists(STOPPED_KEY, namespace=namespace())


def runtimes_running() -> list[str]:
    """The namespaces of the rayq runtimes whose manager runs on this Ray cluster."""
    return sorted(a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"] == MANAGER)


def stop_runtime(timeout_s: float = 30.0, clock: Clock = SystemClock()) -> None:
    """Kill every runtime actor (data stays on disk) and wait until they are gone."""
    deadline = clock.monotonic() + timeout_s
    # no manager is coming back: finding the runtime waits for none (its place stays
    # claimed, for the next start to follow)
    internal_kv._internal_kv_put(STOPPED_KEY, b"1", namespace=namespace())
    forget_place(SQS_STORE)  # the SQS endpoint stops too: its state is not to be restarted
    # Callers before callees: consumers, then the coordinator and manager, shards, and
    # the followers (shards' and control stores') once their leaders are gone (nothing
    # left to ship to them).
    for followers in (False, True):
        names = sorted((n for n in actor_names()
                        if n.startswith((FOLLOWER_PREFIX, CONTROL_FOLLOWER_PREFIX)) == followers),
                       key=lambda n: (n.startswith(shard_name("")),
                                      not n.startswith(consumer_name(""))))
        for handle in running(names).values():
            ray.kill(handle, no_restart=True)
        while set(names) & set(actor_names()) and clock.monotonic() < deadline:
            time.sleep(0.05)
