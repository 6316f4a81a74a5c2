"""Where shards and subqueues live: pure choices over data nodes and shard depths
(docs/replication.md, docs/autoscaling.md).

A data node is a Ray node holding the data resource, named by its
``rayq-data-node`` label. Each node keeps its files under ``<data_dir>/<name>/``,
so nodes never share files, even simulated ones on one machine. The embedded
runtime has one unnamed data node whose files stay directly in ``data_dir``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rayq.core.replication.shard_places import LOCAL_NODE, ShardPlace
from rayq.errors import InvalidMessage, RuntimeFailure

DATA_NODE_LABEL = "rayq-data-node"
# The share of the data resource each actor holding a store copy asks for: enough for
# Ray to count the resource as in use (it counts to 1/10 000), small enough that a
# node offering one unit holds a thousand copies before a pinned actor could not fit.
DATA_CLAIM = 0.001


@dataclass(frozen=True)
class DataNode:
    """A node whose disk keeps shard files: its stable name and its Ray node id."""

    name: str
    node_id: str


def data_nodes_of(nodes: Sequence[Mapping], resource: str | None) -> list[DataNode]:
    """The data nodes among Ray's node records (``ray.nodes()``): alive, holding
    ``resource``, named by their label (else their address), sorted by name. Raises
    RuntimeFailure when two share a name: their files would mix."""
    found = [DataNode((node.get("Labels") or {}).get(DATA_NODE_LABEL) or node["NodeManagerAddress"],
                      node["NodeID"])
             for node in nodes
             if node.get("Alive") and resource and node.get("Resources", {}).get(resource, 0) > 0]
    names = [n.name for n in found]
    if len(set(names)) < len(names):
        raise RuntimeFailure(f"two alive data nodes share a {DATA_NODE_LABEL!r} name: "
                             f"{sorted(names)}; give each its own")
    return sorted(found, key=lambda n: n.name)


def data_claim(node: DataNode, resource: str | None) -> dict[str, float]:
    """The custom resources an actor holding a store copy on ``node`` asks for (Ray's
    ``resources=`` option): :data:`DATA_CLAIM` of ``resource``, so that the autoscaler
    counts a data node holding copies as in use, never idle. Nothing for the embedded
    runtime's unnamed node (it holds no such resource: asking for it would leave the
    actor unschedulable) or when no data resource is configured."""
    return {resource: DATA_CLAIM} if resource and node.name != LOCAL_NODE else {}


def node_with_id(nodes: Sequence[DataNode], node_id: str) -> DataNode:
    """The data node of Ray node ``node_id``; the unnamed one for a node that holds no
    data (or the embedded runtime's only node)."""
    return next((n for n in nodes if n.node_id == node_id), DataNode(LOCAL_NODE, node_id))


def still_draining(marked: Mapping[str, str], nodes: Sequence[DataNode]) -> frozenset[str]:
    """The names among ``nodes`` being drained: ``marked`` maps a drained node's name to
    its Ray node id, so a node that joins again under a drained one's name (a new
    machine, or the same one back with an empty disk) is a new node, not draining."""
    return frozenset(n.name for n in nodes if marked.get(n.name) == n.node_id)


def marked_to_drain(marks: Mapping[str, str], node: str, nodes: Sequence[DataNode]
                    ) -> dict[str, str]:
    """``marks`` with the alive data node named ``node`` marked to drain (by its Ray node
    id, see :func:`still_draining`). Raises InvalidMessage when no alive node has that name."""
    found = {n.name: n.node_id for n in nodes}
    if not isinstance(node, str) or node not in found:
        raise InvalidMessage(f"no alive data node named {node!r:.80}")
    return {**marks, node: found[node]}


def unmarked(marks: Mapping[str, str], node: str) -> dict[str, str]:
    """``marks`` without ``node``'s. Raises InvalidMessage when it is not marked."""
    if not isinstance(node, str) or node not in marks:
        raise InvalidMessage(f"no data node named {node!r:.80} is draining")
    return {name: node_id for name, node_id in marks.items() if name != node}


def shard_indexes(names: Sequence[str]) -> list[int]:
    """The shard indexes among a node folder's entries (``shard-<i>``)."""
    return sorted(int(n[6:]) for n in names if n.startswith("shard-") and n[6:].isdigit())


def shard_count(on_disk: Mapping[str, Sequence[int]], configured: int) -> int:
    """How many shards a runtime starting runs: the ``configured`` ones, and every one
    scaling added that a node's folder holds (``on_disk``: per node, its shard indexes);
    shards are numbered from 0, so the highest index found counts."""
    return max([configured] + [i + 1 for found in on_disk.values() for i in found])


def node_folder(data_dir: str, node: str) -> str:
    """The folder that holds everything ``node`` writes (``data_dir`` itself for the
    embedded runtime's unnamed node)."""
    return os.path.join(data_dir, node) if node else data_dir


def default_replicas(data_nodes: int) -> int:
    """One copy on one node; two as soon as a second data node can hold one."""
    return 1 if data_nodes < 2 else 2


def spread(shards: Sequence[int], nodes: Sequence[str], replicas: int,
           leaders: Mapping[str, int] | None = None) -> dict[int, ShardPlace]:
    """Places for new ``shards`` over ``nodes`` (sorted by name): each leader on the
    node leading fewest shards so far (``leaders``: counts from existing shards),
    its followers on the next nodes round the ring. ``replicas`` is capped by the
    number of nodes: two copies on one disk protect nothing."""
    names = sorted(nodes)
    copies = max(1, min(replicas, len(names)))
    led = {n: (leaders or {}).get(n, 0) for n in names}
    places = {}
    for shard in shards:
        first = min(names, key=lambda n: (led[n], names.index(n)))
        led[first] += 1
        at = names.index(first)
        chosen = tuple(names[(at + k) % len(names)] for k in range(copies))
        places[shard] = ShardPlace(shard, chosen, chosen)
    return places


def new_shard_place(shard: int, places: Mapping[int, ShardPlace], nodes: Sequence[str],
                    replicas: int) -> ShardPlace:
    """The place of ``shard``, added by scaling: led from the node of ``nodes`` (the data
    nodes that take copies) leading fewest of ``places``, followers round the ring."""
    leaders = Counter(p.leader for p in places.values())
    return spread([shard], nodes, replicas, leaders)[shard]


def least_loaded_shard(shard_depths: Mapping[int, int],
                       avoid: Sequence[int] = (), leaders: Mapping[int, str] | None = None) -> int:
    """The shard a new subqueue goes to: the one whose leader's node, then the one itself,
    holds the fewest of the queue's subqueues (``avoid``: the shard of each it has, one
    entry a subqueue), then the fewest messages (lowest index on ties). So each added
    subqueue lands on another server while one is free, and once every shard has one,
    they go round the shards again rather than piling onto the emptiest."""
    leaders = leaders or {}
    on_node = Counter(leaders.get(s, s) for s in avoid)
    on_shard = Counter(avoid)
    return min(shard_depths, key=lambda shard: (on_node[leaders.get(shard, shard)],
                                                on_shard[shard], shard_depths[shard], shard))


def plan_shards(nodes: list[DataNode], on_disk: dict[str, list[int]], shards: int) -> dict[int, str]:
    """Each shard's node: where its files already are, else spread over ``nodes``
    (the node leading fewest shards first)."""
    names = [n.name for n in nodes]
    found = {}
    for name in names:  # a node holds a shard's files only if the shard ran there
        for shard in on_disk.get(name, []):
            found.setdefault(shard, name)
    places = {s: found[s] for s in range(shards) if s in found}
    new = [s for s in range(shards) if s not in places]
    led = {n: sum(1 for v in places.values() if v == n) for n in names}
    for place in spread(new, names, 1, led).values():
        places[place.shard] = place.leader
    return places
