"""The control plane on any data node: the control stores' copies, their watchers,
and starting the control actors where their store's place says (docs/replication.md,
"The control plane").

One :class:`ControlFollower` runs on every data node (``rayq-control-<node>``). It keeps
that node's copy of each control store it follows, in the node's own folder, and
watches each such store's leader: once the leader's node is gone, or its actor missed
:data:`MAX_FAILED_PINGS` pings in a row, it fences the reachable in-sync copies with the
next epoch, claims that epoch in Ray's GCS with the copy that applied most as leader
(only one watcher wins a claim), stops the old actor and starts the store's control
actor on the new leader's node. Nobody runs a command.
"""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import ray

from rayq.names import COORDINATOR, FLOOD_DETECTOR, MANAGER, SQS_STATE, namespace, server_env
from actors.controlstore import (claim, control_follower_name, current_place, drain_marks,
                                 registered_launcher)
from actors.coordinator import CoordinatorRemote
from actors.flood import FloodRemote

from actors.base import CONTROL_MAP_BYTES, LIVENESS_GROUPS, RuntimeActor
from actors.manager import QueueManager
from actors.data_nodes import copies_on_disk, data_nodes, pinned
# a control store's leader is watched as a shard's: the same pings, grace and fencing
from actors.replication.keeper import (actor_options, FENCE_TIMEOUT_S, LEADER_START_S, MAX_FAILED_PINGS,
                             PING_TIMEOUT_S, RECHECK_S, WATCH_INTERVAL_S, answers_ping, kill_named)
from rayq.config import Config
from rayq.core.control.control_places import (ALL_STORES, CONTROL_STORES, SQS_STORE, ControlPlace,
                                              hands_over, starting_places)
from rayq.core.control.placement import (DataNode, data_claim, default_replicas, node_folder,
                                         still_draining)
from rayq.core.replication.shard_places import LOCAL_NODE
from rayq.core.control.control_store import Copies, LeaderWatch, fail_over, watch_round
from rayq.core.kit.clock import Clock
from rayq.core.kit.kv import WriteSet
from rayq.core.kit.private import FILE_MODE
from rayq.core.replication.replica import Replica, check_epoch, clear_for_seed, open_copy
from rayq.errors import RayqError, RuntimeFailure
from rayq.remote import NO_RETRY, call, call_async

ManagerRemote = ray.remote(concurrency_groups=LIVENESS_GROUPS)(QueueManager)
ACTOR_NAMES = {"manager": MANAGER, "coordinator": COORDINATOR, "flood": FLOOD_DETECTOR,
               SQS_STORE: SQS_STATE}


def launch_control(store: str, node: DataNode, data_dir: str, config: Config):
    """Start ``store``'s control actor on ``node``, on that node's copy (unless it runs
    already); restarted by Ray on the same node while the node lives."""
    home = node_folder(data_dir, node.name)
    own = {"manager": (ManagerRemote, (home, config, None, data_dir), {}),
           "coordinator": (CoordinatorRemote, (home, config, None), {}),
           "flood": (FloodRemote, (home, config, None), {})}
    remote, args, options = own[store] if store in own else \
        registered_launcher(store)(home, config)
    start_copy = functools.partial(start_copy_on, data_dir=data_dir, config=config)
    return remote.options(name=ACTOR_NAMES[store], max_restarts=-1, max_task_retries=-1,
                          **{**actor_options(), **options}, **pinned(node)).remote(
        *args, start_copy=start_copy)


def start_copy_on(name: str, data_dir: str, config: Config) -> None:
    """Start the control follower of data node ``name`` and wait until it answers (one
    whose process is gone fails at once, not after Ray's health checks)."""
    node = next(n for n in data_nodes(config) if n.name == name)
    follower = start_control_follower(node, data_dir, config)
    call(lambda: follower.ping.options(max_task_retries=0).remote(), NO_RETRY, timeout_s=60)


def start_control_follower(node: DataNode, data_dir: str, config: Config):
    """The control follower of ``node`` (started unless it runs)."""
    return ControlFollowerRemote.options(
        name=control_follower_name(node.name), namespace=namespace(), lifetime="detached",
        get_if_exists=True, max_restarts=-1, max_task_retries=0, num_cpus=0,
        runtime_env=server_env(), resources=data_claim(node, config.store.data_resource),
        max_concurrency=100, **pinned(node)).remote(node.name, data_dir, config)


class ControlFollower(RuntimeActor):
    def __init__(self, node: str, data_dir: str, config: Config, clock: Clock | None = None):
        super().__init__("control", clock)
        self.node, self.data_dir, self.config = node, data_dir, config
        self._copies = Copies(lambda store: open_copy(self._folder(store), CONTROL_MAP_BYTES))
        self._watch = LeaderWatch(node, MAX_FAILED_PINGS, LEADER_START_S,
                                  self.clock.monotonic())
        self._run_paced("control watch", self.watch,
                        lambda: RECHECK_S if self._watch.missing() else WATCH_INTERVAL_S)

    def _folder(self, store: str) -> str:
        return os.path.join(node_folder(self.data_dir, self.node), store)

    def _copy(self, store: str) -> Replica:
        return self._copies[store]

    # -- the leader's calls --------------------------------------------------------------
    async def apply(self, store: str, epoch: int, first_seq: int, write_sets: list[WriteSet]) -> int:
        return self._copy(store).apply(epoch, first_seq, write_sets)

    async def fence(self, store: str, epoch: int) -> tuple[int, int]:
        return self._copy(store).fence(epoch)

    async def state(self, store: str) -> tuple[int, int]:
        """(epoch held, last sequence number applied) of this node's copy of ``store``."""
        return self._copy(store).epoch, self._copy(store).seq

    async def install(self, store: str, data: bytes, epoch: int, seq: int) -> int:
        """Replace this node's copy of ``store`` with the leader's (``data``: its LMDB
        file as of ``seq``, under ``epoch``). Refused with StaleEpoch when this copy holds
        a newer epoch (a replaced leader's late seed); a copy that applied more than
        ``seq`` is kept aside, never deleted: it may hold what a leader acknowledged."""
        check_epoch(self._copy(store).epoch, epoch, "seed")
        self.release(store)
        folder = self._folder(store)
        clear_for_seed(folder, seq)
        path = os.path.join(folder, "data.mdb")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._copy(store).install(epoch, seq)
        return seq

    def release(self, store: str) -> None:
        """Close this node's copy of ``store``: its control actor opens it as leader."""
        self._copies.release(store)

    async def ping(self) -> bool:
        """True once the follower is up. Answered on its own loop: it declares no liveness
        group (it is waited for at start, never failed over on a missed ping)."""
        return True

    # -- watching the leaders ---------------------------------------------------------------
    async def watch(self) -> None:
        """One round: each store this node holds an in-sync copy of has its leader
        checked; a lost one is replaced (:func:`~rayq.core.control.control_store.watch_round`).
        A leader on a draining node is replaced too, once its store has as many copies
        in sync on nodes that stay."""
        marks = drain_marks()  # Ray's node table is read only when a leader may have to go
        nodes: dict[str, DataNode] = {}
        draining: set[str] = set()

        def staying() -> set[str]:
            found = data_nodes(self.config)
            nodes.update((n.name, n) for n in found)
            draining.update(still_draining(marks, found))
            return set(nodes) - draining

        def drains(place: ControlPlace) -> bool:
            if place.leader not in marks:
                return False
            alive = staying()
            return hands_over(place, draining, alive,
                              self.config.store.replicas or default_replicas(len(alive)))
        failover = RayFailover(nodes, self.data_dir, self.config)
        await watch_round(self._watch, {s: current_place(s) for s in ALL_STORES}, staying,
                          drains, lambda store: answers_ping(ACTOR_NAMES[store], PING_TIMEOUT_S),
                          lambda place, alive: fail_over(place, alive, failover,
                                                         prefer=self.node),
                          self.clock.monotonic())




class RayFailover:
    """:class:`~rayq.core.control.control_store.FailoverPeers` through Ray: the copies by
    their follower's name (the watcher's own too: it answers while it watches)."""

    def __init__(self, nodes: dict[str, DataNode], data_dir: str, config: Config):
        self.nodes, self.data_dir, self.config = nodes, data_dir, config

    claim = staticmethod(claim)

    async def fence(self, node: str, store: str, epoch: int) -> int | None:
        try:
            handle = ray.get_actor(control_follower_name(node), namespace=namespace())
            return (await asyncio.wait_for(call_async(
                lambda: handle.fence.remote(store, epoch), NO_RETRY), FENCE_TIMEOUT_S))[1]
        except (RayqError, ray.exceptions.RayError, ValueError, asyncio.TimeoutError):
            return None

    async def replace(self, old: ControlPlace, new: ControlPlace) -> None:
        await kill_named(ACTOR_NAMES[old.store])
        handle = ray.get_actor(control_follower_name(new.leader), namespace=namespace())
        await call_async(lambda: handle.release.remote(old.store))
        launch_control(old.store, self.nodes[new.leader], self.data_dir, self.config)


# -- at the runtime's start ------------------------------------------------------------------
def place_control(nodes: list[DataNode], data_dir: str,
                  stores: tuple[str, ...] = CONTROL_STORES) -> dict[str, ControlPlace]:
    """Each of ``stores``' place: the one claimed in Ray's GCS (cut to the in-sync
    copies that applied the most: a node back with an empty folder leads nothing),
    else rebuilt from the copies on the data nodes' disks (the one that applied most
    leads), else a new one on the first data node by name. Claimed when changed."""
    return starting_places({s: current_place(s) for s in stores},
                           copies_on_disk(nodes, data_dir), [n.name for n in nodes],
                           claim, current_place)


def control_starter(nodes: list[DataNode], data_dir: str, config: Config,
                    stores: tuple[str, ...] = CONTROL_STORES):
    """A function that starts one of ``stores``' control actors where it belongs. The
    embedded runtime's unnamed node keeps them without places (one copy, nowhere to
    move); on a cluster every data node runs its control follower first."""
    if nodes[0].name == LOCAL_NODE:
        return lambda store: launch_control(store, nodes[0], data_dir, config)
    for follower in [start_control_follower(n, data_dir, config) for n in nodes]:
        call(lambda follower=follower: follower.ping.remote(), NO_RETRY)
    places = place_control(nodes, data_dir, stores)
    return lambda store: ensure_control(store, places[store], nodes, data_dir, config)


def ensure_control(store: str, place: ControlPlace, nodes: list[DataNode], data_dir: str,
                   config: Config):
    """``store``'s control actor, started on its place's leader (unless it runs); failed
    over first when that leader's node is gone. Raises RuntimeFailure when no in-sync
    copy of the store is on an alive node."""
    by_name = {n.name: n for n in nodes}
    if place.leader not in by_name:
        with ThreadPoolExecutor(1) as pool:  # the caller may run an event loop of its own
            pool.submit(asyncio.run, fail_over(place, by_name, RayFailover(
                by_name, data_dir, config))).result()
        place = current_place(store)
        if place.leader not in by_name:
            raise RuntimeFailure(f"control store {store}: no in-sync copy on an alive node "
                                 f"(in sync: {list(place.in_sync)}, epoch {place.epoch})")
    return launch_control(store, by_name[place.leader], data_dir, config)


ControlFollowerRemote = ray.remote(ControlFollower)
