"""Starting, finding and stopping the runtime's named actors (namespace ``rayq``)."""

from __future__ import annotations

import time

import ray

from actors import COORDINATOR, FLOOD_DETECTOR, MANAGER, consumer_name, shard_name
from actors.coordinator import CoordinatorRemote
from actors.flood import FloodRemote
from actors.kit import manager_handle, shard_handles
from actors.manager import QueueManager
from actors.placement import data_nodes, pinned, publish, published_places, shards_on_disk
from actors.replicas import ACTOR_OPTIONS, start_followers, start_shard
from actors.shipping import FOLLOWER_PREFIX
from rayq.config import Config
from rayq.core.control.placement import (DataNode, ShardPlace, default_replicas, node_folder,
                                         plan_shards)
from rayq.core.control.replicas import reusable, with_followers
from rayq.core.kit.clock import Clock, SystemClock
from rayq.errors import RuntimeFailure
from rayq.remote import NO_RETRY, actor_names, call, running

ManagerRemote = ray.remote(QueueManager)


def runtime_options(node: DataNode) -> dict:
    """Actor options: detached, named, no CPU, pinned to ``node``, where its files are."""
    return {**ACTOR_OPTIONS, **pinned(node)}


def plan(nodes: list[DataNode], data_dir: str, config: Config) -> dict[int, ShardPlace]:
    """Every shard's place: as published (the manager keeps it while the cluster
    lives), else where its files are or spread, with followers round the ring."""
    places = published_places()
    if reusable(places, config.store.shards, {n.name for n in nodes}):
        return places
    leaders = plan_shards(nodes, shards_on_disk(nodes, data_dir), config.store.shards)
    copies = config.store.replicas or default_replicas(len(nodes))
    return with_followers(leaders, [n.name for n in nodes], copies)


def _launch(remote, name: str, node: DataNode, *args):
    """Start the named runtime actor ``name`` on ``node`` unless it runs already;
    restarted by Ray whenever it dies, its calls retried across the restart."""
    return remote.options(name=name, max_restarts=-1, max_task_retries=-1,
                          **runtime_options(node)).remote(*args)


def _ready(handles: list) -> list:
    """``handles`` once each answers (an actor that cannot start fails the start at once)."""
    for handle in handles:
        call(lambda handle=handle: handle.ping.remote(), NO_RETRY)
    return handles


def ensure_runtime(data_dir: str, config: Config, consumers: int | None = None) -> dict:
    """Create the shards, the manager and the consumers unless they run already.

    Shards spread over the data nodes (docs/replication.md), each pinned to its
    node and keeping its files in that node's folder of ``data_dir``; a shard
    whose files a node already holds starts there again. With more than one copy
    its followers start first, on the next nodes. The control actors run on
    the first data node by name. ``consumers`` sets how many consumer actors run;
    None keeps the number a previous run chose (or the configured one). Returns the
    handles."""
    nodes = data_nodes(config)
    by_name = {n.name: n for n in nodes}
    places = plan(nodes, data_dir, config)
    publish(places)
    for follower in start_followers(places, nodes, data_dir, config):  # before their leaders
        call(lambda follower=follower: follower.state.remote(), NO_RETRY)
    shards = _ready([start_shard(i, by_name[place.leader], data_dir, config)
                     for i, place in sorted(places.items())])
    control, home = nodes[0], node_folder(data_dir, nodes[0].name)
    # each after the ones it finds at start: the manager the shards, the others both
    [manager] = _ready([_launch(ManagerRemote, MANAGER, control, home, config, None, data_dir)])
    [coordinator, _] = _ready([_launch(remote, name, control, home, config) for remote, name
                               in ((CoordinatorRemote, COORDINATOR), (FloodRemote, FLOOD_DETECTOR))])
    call(lambda: manager.scale_consumers.remote(consumers))
    return {"manager": manager, "shards": shards, "coordinator": coordinator}


def find_runtime() -> dict:
    """Handles of a running runtime. Raises RuntimeFailure when none runs."""
    try:
        manager = manager_handle()
    except ValueError as err:
        raise RuntimeFailure("no rayq runtime is running in this Ray cluster; "
                             "call rayq.start() first") from err
    config = call(lambda: manager.config_value.remote())
    return {"manager": manager, "shards": shard_handles(config, config.store.local_channel),
            "config": config}


def stop_runtime(timeout_s: float = 30.0, clock: Clock = SystemClock()) -> None:
    """Kill every runtime actor (data stays on disk) and wait until they are gone."""
    deadline = clock.monotonic() + timeout_s
    # Callers before callees: consumers, then the coordinator and manager, shards, and
    # the shards' followers once their leaders are gone (nothing left to ship to them).
    for followers in (False, True):
        names = sorted((n for n in actor_names() if n.startswith(FOLLOWER_PREFIX) == followers),
                       key=lambda n: (n.startswith(shard_name("")),
                                      not n.startswith(consumer_name(""))))
        for handle in running(names).values():
            ray.kill(handle, no_restart=True)
        while set(names) & set(actor_names()) and clock.monotonic() < deadline:
            time.sleep(0.05)
