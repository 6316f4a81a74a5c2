"""Finding data nodes and pinning actors to them (docs/replication.md).

The choices are :mod:`rayq.core.control.placement`'s; this module asks Ray which
nodes are alive, which hold the data resource, and what their folders already hold.
"""

from __future__ import annotations

import os

import ray
import ray.experimental.internal_kv
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayq.names import namespace
from rayq.config import Config
from rayq.core.control.placement import DATA_NODE_LABEL, DataNode, data_nodes_of, node_folder
from rayq.core.replication.shard_places import LOCAL_NODE, ShardPlace
from rayq.core.control.control_places import copy_folders
from rayq.core.replication.shard_places import decode_places, encode_places
from rayq.core.kit.kv import peek
from rayq.core.storage.layout import REPLICA_KEY, read_replica_state
from rayq.remote import PLACEMENT_KEY  # in Ray's GCS key-value store: each shard's ShardPlace


def data_nodes(config: Config) -> list[DataNode]:
    """The alive nodes holding ``config.store.data_resource``, by name; without any
    (the embedded runtime on one machine) this node alone, unnamed."""
    found = data_nodes_of(ray.nodes(), config.store.data_resource)
    return found or [DataNode(LOCAL_NODE, ray.get_runtime_context().get_node_id())]


def this_node_name() -> str:
    """The data-node name of the node this process runs on ("" without a label)."""
    return ray.get_runtime_context().get_node_labels().get(DATA_NODE_LABEL, "")


def this_node_names() -> frozenset[str]:
    """Every name an admin may give the node this process runs on: its Ray node id, its
    IP address and its data-node label if it has one."""
    names = {ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(),
             this_node_name()}
    return frozenset(n for n in names if n)


def pinned(node: DataNode) -> dict:
    """Actor options that keep an actor on ``node`` (its files are there), restarts too."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}


@ray.remote(num_cpus=0)
def _copies_in(folder: str) -> dict[str, tuple[int, int]]:
    """(epoch, last sequence number) of each store copy ``folder`` holds (a shard's
    ``shard-<i>`` or a control store's folder), on the node this runs on."""
    names = copy_folders(os.listdir(folder)) if os.path.isdir(folder) else []
    return {name: read_replica_state(peek(os.path.join(folder, name), "meta", REPLICA_KEY))
            for name in names}


def copies_on_disk(nodes: list[DataNode], data_dir: str) -> dict[str, dict[str, tuple[int, int]]]:
    """Per data node, per folder name: (epoch, sequence) of each copy its disk holds."""
    refs = {n.name: _copies_in.options(**pinned(n)).remote(node_folder(data_dir, n.name))
            for n in nodes}
    return {name: ray.get(ref, timeout=60) for name, ref in refs.items()}


def publish(places: dict[int, ShardPlace]) -> None:
    """Record each shard's replicas, in-sync set and epoch where every client and actor
    can read them (the manager's store keeps them durably)."""
    ray.experimental.internal_kv._internal_kv_put(PLACEMENT_KEY, encode_places(places),
                                                  overwrite=True, namespace=namespace())


def published_places() -> dict[int, ShardPlace]:
    """Each shard's place as last published ({} before the runtime placed any)."""
    return decode_places(ray.experimental.internal_kv._internal_kv_get(PLACEMENT_KEY,
                                                                       namespace=namespace()))
