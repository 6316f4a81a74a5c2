"""What the runtime's actors share, said once: finding each other, background loops whose
failures are counted, and, for the control actors (manager, fairness coordinator,
flood detector), their own LMDB environment, a durable gate and the shard handles.

An async runtime actor subclasses :class:`RuntimeActor` (the consumers, the outcome desks,
the control followers), :class:`GatedActor` when it checks signed calls (the shards), or
:class:`ControlActor`, and keeps to its own work; its signed surface is its entries in
:mod:`rayq.core.auth.operations` (``@signed`` methods), beside the table of its internal
methods (those only the runtime calls).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import ray

from actors.controlstore import RayControlPeers, draining_nodes
from actors.metrics import BackgroundFailures
from actors.data_nodes import data_nodes
from rayq.config import Config
from rayq.core.auth.gate import Directory, Gate, durable_gate
from rayq.core.control.control_store import ControlReplication
from rayq.core.control.placement import DataNode, default_replicas, node_with_id
from rayq.core.replication.shard_places import LOCAL_NODE
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.kv import LmdbKV
from rayq.remote import ShardLinks, call_async, manager_handle

CONTROL_MAP_BYTES = 64 << 20  # a control actor's LMDB: registries, rules, histories
COPIES_INTERVAL_S = 5.0       # how often a control actor checks its store's copies (a lost
                              # one is also noticed by the next write that fails)
# A leader's ping is answered on a thread of its own (a concurrency group): a leader busy
# with a long write still answers, so only a process that is gone or stopped misses pings
# and is failed over (actors.replication.keeper.answers_ping).
LIVENESS = "liveness"
LIVENESS_GROUPS = {LIVENESS: 1}


def shard_handles(config: Config, use_channel: bool = False) -> ShardLinks:
    """Every shard's handle, by index: links that find a shard's leader again when it
    moved (failover, docs/replication.md), their hot calls over the local channel if
    ``use_channel``; the shards scaling added too (as published, at least the
    configured ones), and more as they are named (:class:`~rayq.remote.ShardLinks`)."""
    return ShardLinks(config.store.shards, use_channel).refresh()


async def manager_directory() -> Directory:
    """The directory gates verify signed requests with, as the manager holds it (how
    actors other than the manager fetch it)."""
    manager = manager_handle()
    return await call_async(lambda: manager.directory.remote())


def open_kv(data_dir: str, component: str, map_size: int = CONTROL_MAP_BYTES) -> LmdbKV:
    """An actor's own LMDB environment, in ``data_dir/component``."""
    return LmdbKV(os.path.join(data_dir, component), map_size=map_size)


class RuntimeActor:
    """An async runtime actor: its clock, its background loops (failures logged and
    counted, :class:`~actors.metrics.BackgroundFailures`) and the calls every runtime
    actor answers. ``index``: which of several the actor is (a shard's, a consumer's)."""

    def __init__(self, component: str, clock: Clock | None = None, index: int | None = None):
        self.clock = clock or SystemClock()
        self.index = index
        self.failures = BackgroundFailures(component, index)
        self._loops: list[asyncio.Task] = []

    def _run_every(self, interval_s: float, loop: str, step: Callable[[], Awaitable],
                   first_s: float | None = None) -> None:
        """Run ``step`` every ``interval_s`` seconds for the actor's life (the first time
        after ``first_s``); a failed round is counted and the next one tries again."""
        self._start_loop(self.failures.every(interval_s, loop, step, first_s))

    def _run_paced(self, loop: str, step: Callable[[], Awaitable],
                   pause_s: Callable[[], float]) -> None:
        """Run ``step`` for the actor's life, each round after a wait of ``pause_s()``
        seconds (asked before each wait: a loop that hurries while it has work); a failed
        round is counted and the next one tries again."""
        self._start_loop(self.failures.paced(loop, step, pause_s))

    def _start_loop(self, loop: Awaitable) -> None:
        self._loops.append(asyncio.get_running_loop().create_task(loop))

    @ray.method(concurrency_group=LIVENESS)
    async def ping(self) -> int | bool:
        """Once the actor is up: its index, or True for an actor without one (the runtime
        waits for it at start, failover watches it); answered while the actor's own loop
        is busy (:data:`LIVENESS`)."""
        return True if self.index is None else self.index

    async def background_failures(self) -> dict[str, int]:
        """Failed rounds of each background loop since the actor started."""
        return dict(self.failures.counts)


class GatedActor(RuntimeActor):
    """A runtime actor whose signed calls its gate checks. A subclass sets ``self.gate``
    (a :class:`~rayq.core.auth.gate.Gate`)."""

    gate: Gate

    async def forget_keys(self) -> None:
        """Account keys or task queues changed: verify the next signed request with a
        fresh copy of the directory."""
        self.gate.forget()


class ControlActor(GatedActor):
    """A control actor: a :class:`GatedActor` with its own store (``self.kv``: an LMDB
    environment in its node's folder, kept on the in-sync copies of its place on other
    data nodes, :class:`~actors.controlstore.ControlReplication`), a gate whose seen
    nonces live there, and the shard handles. ``directory``: where its gate fetches
    accounts and places (the manager's own method for the manager; by default, a call
    to the manager). ``start_copy(node)``: starts the control follower of a data node
    that is to hold a new copy (handed in by whoever launches the actor)."""

    def __init__(self, component: str, data_dir: str, config: Config, clock: Clock | None = None,
                 *, directory: Callable[[], Awaitable[Directory]] = manager_directory,
                 start_copy: Callable[[str], None] | None = None):
        super().__init__(component, clock)
        self.data_dir, self.config = data_dir, config
        self.kv = replicated_store(component, open_kv(data_dir, component), config, start_copy)
        self.gate = durable_gate(directory, self.kv, self.clock)
        self.shards = shard_handles(config)
        self._run_every(COPIES_INTERVAL_S, "control copies", self._keep_copies)

    async def _keep_copies(self) -> None:
        keep_copies(self.kv, self.config)


def keep_copies(kv: ControlReplication, config: Config) -> None:
    """One round of keeping a control store's copies (:meth:`ControlReplication.keep`);
    nothing for a store with one copy and no place (the embedded runtime)."""
    if kv.place is None:
        return
    nodes = data_nodes(config)
    kv.keep([n.name for n in nodes], config.store.replicas or default_replicas(len(nodes)),
            draining_nodes(nodes))


def replicated_store(store: str, kv: LmdbKV, config: Config | None,
                     start_copy: Callable[[str], None] | None) -> ControlReplication:
    """``kv``, the store of a control actor running here, kept on its place's copies on a
    cluster (plain on the embedded runtime's unnamed node, or with no ``config``)."""
    node = LOCAL_NODE if config is None else this_data_node(config).name
    return ControlReplication(store, kv, node,
                              None if node == LOCAL_NODE else RayControlPeers(start_copy))


def this_data_node(config: Config) -> DataNode:
    """The data node this process runs on (the embedded runtime's unnamed one, or a
    node without the data resource, as the unnamed node)."""
    return node_with_id(data_nodes(config), ray.get_runtime_context().get_node_id())

