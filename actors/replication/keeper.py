"""Starting a shard's replicas, and the manager's keeping of them: the in-sync sets,
durably and under epochs, and failover (docs/replication.md).

The decisions are :mod:`rayq.core.replication.shard_places`'; this module asks Ray which
nodes are alive, pings leaders, fences followers and starts or stops actors.
"""

from __future__ import annotations

import asyncio
import logging
import os

import ray

from rayq.names import namespace, server_env, shard_name
from actors.controlstore import draining_nodes
from actors.replication.follower import FollowerRemote
from actors.data_nodes import data_nodes, pinned, publish, published_places
from actors.shard import CONCURRENCY_GROUPS, ShardActor
from actors.replication.leader import follower_name
from rayq.config import Config
from rayq.core.control.placement import (DataNode, data_claim, default_replicas, new_shard_place,
                                          node_folder)
from rayq.core.replication.shard_places import LOCAL_NODE, ShardPlace
from rayq.core.replication.shard_places import (check_epoch, count_missed, decode_places,
                                                drain_seeds, drain_step, drop_follower,
                                                encode_places, fail_over, leader_move, left_on,
                                                lost_leaders, missing, newest, pings_counted,
                                                rejoin, seeds_wanted, shrink, watched)
from rayq.core.kit.clock import Clock
from rayq.core.kit.kv import LmdbKV
from rayq.errors import RayqError
from rayq.remote import NO_RETRY, call_async, running

log = logging.getLogger("rayq.replicas")
ShardRemote = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(ShardActor)
# Runtime actors only coordinate and do I/O: they take no CPU slot from consumers. Those
# that hold a store copy also ask for a sliver of their node's data resource (data_claim),
# so that the autoscaler never counts a data node holding copies as idle.
def actor_options() -> dict:
    """Options of a runtime actor that holds a store copy or leads a control store."""
    return dict(namespace=namespace(), lifetime="detached", get_if_exists=True, num_cpus=0,
                max_concurrency=1000, runtime_env=server_env())
PLACES_KEY = b"places"      # in the manager's meta table: every shard's ShardPlace
WATCH_INTERVAL_S = 1.0      # how often the manager checks the leaders
PING_TIMEOUT_S = 1.0        # a leader slower than this to answer a ping missed it
MAX_FAILED_PINGS = 3        # missed in a row: the leader counts as lost
RECHECK_S = 0.2             # after a missed ping, the next comes this soon
FENCE_TIMEOUT_S = 2.0
GONE_TIMEOUT_S = 10.0       # how long a killed actor's name may take to free
SEED_TIMEOUT_S = 600.0      # copying a shard to a new follower and catching up
LEADER_START_S = 60.0       # a leader started here may take this long to answer a first ping
FOLLOWER_START_S = 15.0     # a follower a failover starts again on its copy, to answer


async def answers_ping(name: str, timeout_s: float) -> bool:
    """Whether the runtime actor ``name`` answers a ping within ``timeout_s``. The ping
    is not retried by Ray: an actor whose process is gone fails it at once, long before
    Ray's health checks call its node dead."""
    try:
        handle = ray.get_actor(name, namespace=namespace())
        await asyncio.wait_for(call_async(
            lambda: handle.ping.options(max_task_retries=0).remote(), NO_RETRY), timeout_s)
        return True
    except (RayqError, ray.exceptions.RayError, ValueError, asyncio.TimeoutError):
        return False


def runtime_options(node: DataNode) -> dict:
    """Actor options: detached, named, no CPU, pinned to ``node``, where its files are."""
    return {**actor_options(), **pinned(node)}


def shard_folder(data_dir: str, node: str, index: int) -> str:
    return os.path.join(node_folder(data_dir, node), f"shard-{index}")


def start_shard(index: int, node: DataNode, data_dir: str, config: Config):
    """The shard's leader, pinned to ``node``, on that node's folder of the shard."""
    return ShardRemote.options(name=shard_name(index), max_restarts=-1, max_task_retries=-1,
                               resources=data_claim(node, config.store.data_resource),
                               **actor_options(), **pinned(node)).remote(
        index, shard_folder(data_dir, node.name, index), config)


def start_follower(index: int, node: DataNode, data_dir: str, config: Config):
    """A follower of shard ``index`` on ``node``: calls are never retried (the leader
    takes a follower that fails out of the in-sync set)."""
    return FollowerRemote.options(name=follower_name(index, node.name), namespace=namespace(),
                                  lifetime="detached", get_if_exists=True, max_restarts=-1,
                                  max_task_retries=0, num_cpus=0, runtime_env=server_env(),
                                  resources=data_claim(node, config.store.data_resource),
                                  **pinned(node)).remote(
        index, shard_folder(data_dir, node.name, index), config.store.initial_map_bytes)


def start_followers(places: dict[int, ShardPlace], nodes: list[DataNode], data_dir: str,
                    config: Config) -> list:
    by_name = {n.name: n for n in nodes}
    return [start_follower(shard, by_name[node], data_dir, config)
            for shard, place in sorted(places.items()) for node in place.in_sync[1:]]


async def kill_named(name: str) -> None:
    """Kill the runtime actor ``name`` for good (if it runs) and wait until its name
    is free, so an actor of that name can be started anew."""
    try:
        ray.kill(ray.get_actor(name, namespace=namespace()), no_restart=True)
    except ValueError:
        return
    for _ in range(int(GONE_TIMEOUT_S / 0.1)):
        try:
            ray.get_actor(name, namespace=namespace())
        except ValueError:
            return
        await asyncio.sleep(0.1)


class ReplicaKeeper:
    """The manager's part: every shard's place, durable in its store and published in
    Ray's GCS; in-sync changes asked by leaders; the leaders watched, and replaced by
    an in-sync follower when lost."""

    def __init__(self, kv: LmdbKV, data_dir: str, config: Config, clock: Clock,
                 suspect: str | None = None):
        """``suspect``: the node a failover of the manager's own store just gave up on; a
        shard leader there counts as lost at its first missed ping."""
        self.kv, self.data_dir, self.config, self.clock = kv, data_dir, config, clock
        stored = decode_places(kv.read(lambda txn: txn.get("meta", PLACES_KEY)))
        self.places = newest(stored, published_places())
        self._save()
        self._missed: dict[int, int] = {p.shard: MAX_FAILED_PINGS - 1
                                        for p in self.places.values() if p.leader == suspect}
        self._seeding: dict[int, asyncio.Task] = {}
        self._starting: dict[int, float] = {}  # leaders started, not yet answered: until when
        self._lock = asyncio.Lock()

    def _save(self) -> None:
        raw = encode_places(self.places)
        self.kv.transact(lambda txn: txn.put("meta", PLACES_KEY, raw))
        publish(self.places)

    async def shrink(self, shard: int, node: str, epoch: int) -> ShardPlace:
        """Take ``node`` out of ``shard``'s in-sync set, as its leader of ``epoch`` asks;
        the new place. Raises StaleEpoch when that leader was replaced."""
        async with self._lock:
            self.places[shard] = place = shrink(self.places[shard], node, epoch)
            self._save()
            log.warning("shard %d: %s out of sync, epoch %d", shard, node, place.epoch)
            return place

    async def rejoin(self, shard: int, node: str, epoch: int) -> ShardPlace:
        """Put a seeded follower that caught up in ``shard``'s in-sync set, as its
        leader of ``epoch`` asks; the new place. Raises StaleEpoch when that leader
        was replaced."""
        async with self._lock:
            check_epoch(self.places[shard].epoch, epoch, "in-sync change")
            self.places[shard] = place = rejoin(self.places[shard], node)
            self._save()
            log.warning("shard %d: %s in sync, epoch %d", shard, node, place.epoch)
            return place

    async def watch(self) -> None:
        """One round: a leader whose node is gone, or that missed MAX_FAILED_PINGS pings
        in a row, is replaced by an in-sync follower; an under-replicated shard gets a
        new follower seeded."""
        if all(p.leader == LOCAL_NODE for p in self.places.values()):
            return  # the embedded runtime: one copy, nowhere to fail over to
        nodes = data_nodes(self.config)
        draining = draining_nodes(nodes)
        await self._check_leaders(nodes)
        self._reseed(nodes, draining)
        if draining:
            await self._drain(nodes, draining)
        else:
            await self._balance(nodes)

    async def _check_leaders(self, nodes: list[DataNode]) -> None:
        """Ping every replicated shard's leader; while one missed its last ping without
        counting as lost yet, ping again after RECHECK_S (a lost leader is replaced a
        few seconds after it stopped answering, not a few rounds)."""
        while True:
            replicated = watched(self.places.values())
            answered = await asyncio.gather(*(self._ping(p.shard) for p in replicated))
            counted, self._starting = pings_counted(
                {p.shard: ok for p, ok in zip(replicated, answered)}, self._starting,
                self.clock.monotonic())
            self._missed = count_missed(self._missed, counted)
            for shard in lost_leaders(replicated, {n.name for n in nodes}, self._missed,
                                      MAX_FAILED_PINGS):
                async with self._lock:
                    await self._fail_over(self.places[shard], nodes)
                    self._missed[shard] = 0
            if not missing(self._missed, MAX_FAILED_PINGS):
                return
            await asyncio.sleep(RECHECK_S)

    def _copies(self, nodes: list[DataNode]) -> int:
        return self.config.store.replicas or default_replicas(len(nodes))

    def _reseed(self, nodes: list[DataNode], draining: frozenset[str] = frozenset()) -> None:
        """Seed a follower for each shard short of copies (on a node that is not
        draining), and for each shard that would be short without its draining copies."""
        by_name = {n.name: n for n in nodes}
        copies, busy = self._copies(nodes), set(self._seeding)
        staying = [n for n in by_name if n not in draining]
        wanted = seeds_wanted(self.places, staying, copies, busy) + \
            drain_seeds(self.places, draining, list(by_name), copies, busy)
        for shard, node in dict(wanted).items():
            task = self._seeding[shard] = asyncio.get_running_loop().create_task(
                self._seed(shard, by_name[node]))
            task.add_done_callback(lambda _, shard=shard: self._seeding.pop(shard, None))

    async def _balance(self, nodes: list[DataNode]) -> None:
        """Move one shard's leadership to a node that leads too few (one that joined),
        once everything is in sync: new subqueues then land on its shards too."""
        move = leader_move(self.places, [n.name for n in nodes], bool(self._seeding))
        if move is not None:
            shard, node = move
            async with self._lock:
                log.warning("shard %d: leadership moves to %s", shard, node)
                await self._fail_over(self.places[shard], nodes, prefer=node)

    async def _drain(self, nodes: list[DataNode], draining: frozenset[str]) -> None:
        """One move off the draining nodes (:func:`drain_step`): a leadership handed to
        an in-sync follower that stays, or a draining follower let go, once the shard
        has its copies in sync on nodes that stay."""
        step = drain_step(self.places, draining, [n.name for n in nodes], self._copies(nodes))
        if step is None or self._seeding:
            return
        action, shard, node = step
        async with self._lock:
            place = self.places[shard]
            if action == "lead":
                log.warning("shard %d: leadership moves off draining %s to %s", shard,
                            place.leader, node)
                await self._fail_over(place, nodes, prefer=node)
                return
            log.warning("shard %d: the follower on draining %s leaves", shard, node)
            self.places[shard] = drop_follower(place, node)
            self._save()
        await kill_named(follower_name(shard, node))

    def left_on(self, node: str) -> dict[str, int]:
        """What ``node`` still holds of the shards (a drain is done at zero)."""
        return left_on(self.places, node)

    async def _seed(self, shard: int, node: DataNode) -> None:
        """Start a fresh follower on ``node`` and have the leader seed it; done once the
        follower is in sync (the leader asks for that once it caught up) or lost: a
        shard stays out of :meth:`_reseed`'s choice until then."""
        try:
            await kill_named(follower_name(shard, node.name))  # an out-of-sync one: anew
            follower = start_follower(shard, node, self.data_dir, self.config)
            await asyncio.wait_for(call_async(lambda: follower.state.remote()), SEED_TIMEOUT_S)
            leader = ray.get_actor(shard_name(shard), namespace=namespace())
            seq = await asyncio.wait_for(call_async(lambda: leader.seed.remote(node.name),
                                                    NO_RETRY), SEED_TIMEOUT_S)
            log.warning("shard %d: follower on %s seeded at %d, in sync", shard, node.name, seq)
        except (RayqError, ray.exceptions.RayError, ValueError, asyncio.TimeoutError) as err:
            log.warning("shard %d: seeding a follower on %s failed: %r", shard, node.name, err)

    async def _ping(self, shard: int) -> bool:
        return await answers_ping(shard_name(shard), PING_TIMEOUT_S)

    async def _fail_over(self, place: ShardPlace, nodes: list[DataNode],
                         prefer: str | None = None) -> None:
        """Replace ``place``'s leader by the in-sync follower that applied most
        (``prefer`` if it applied as much): see :func:`rayq.core.replication.shard_places.fail_over`."""
        await fail_over(place, [n.name for n in nodes], RayFailover(self, nodes), prefer)

    async def add_shard(self, shard: int, nodes: list[DataNode]) -> ShardPlace:
        """Place and start ``shard``, added by scaling (docs/autoscaling.md): led from the
        data node leading fewest shards, not a draining one, followers round the ring;
        recorded first (its leader reads its place as it starts), returned once it
        answers. Again for a shard recorded already: its actors run, or start again."""
        staying = [n.name for n in nodes if n.name not in draining_nodes(nodes)] or \
            [n.name for n in nodes]
        async with self._lock:
            place = self.places.get(shard) or new_shard_place(
                shard, self.places, staying, self._copies(nodes))
            self.places[shard] = place
            self._save()
            self._starting[shard] = self.clock.monotonic() + LEADER_START_S
        await self.start_recorded(place, nodes)
        return place

    async def start_recorded(self, place: ShardPlace, nodes: list[DataNode]) -> None:
        """Start ``place``'s followers, then its leader (those that run already are kept),
        and return once the leader answers."""
        by_name = {n.name: n for n in nodes}
        for follower in start_followers({place.shard: place}, nodes, self.data_dir, self.config):
            await asyncio.wait_for(call_async(lambda f=follower: f.state.remote(), NO_RETRY),
                                   LEADER_START_S)
        leader = start_shard(place.shard, by_name[place.leader], self.data_dir, self.config)
        await asyncio.wait_for(call_async(lambda: leader.ping.remote(), NO_RETRY), LEADER_START_S)

    async def start_missing(self, nodes: list[DataNode]) -> None:
        """Start each recorded shard that runs nowhere while its leader's node is alive: a
        manager replaced while it added that shard, or a cold start that found no copy
        of it (it was recorded before its leader first opened its files)."""
        alive = {n.name for n in nodes}
        async with self._lock:  # not while a failover replaces a leader
            for place in list(self.places.values()):
                if place.leader in alive and not running([shard_name(place.shard)]):
                    self._starting[place.shard] = self.clock.monotonic() + LEADER_START_S
                    await self.start_recorded(place, nodes)

    def lead(self, place: ShardPlace, node: DataNode) -> None:
        """Record ``place`` and start its leader on ``node``, which reads the place
        (followers, epoch) as it starts and misses no ping for a while."""
        self.places[place.shard] = place
        self._save()
        start_shard(place.shard, node, self.data_dir, self.config)
        self._starting[place.shard] = self.clock.monotonic() + LEADER_START_S


class RayFailover:
    """A shard's failover through Ray (:class:`rayq.core.replication.shard_places.FailoverPeers`):
    followers fenced by name, the old leader and the promoted follower's actor killed,
    the new leader started by ``keeper``."""

    def __init__(self, keeper: ReplicaKeeper, nodes: list[DataNode]):
        self.keeper, self.nodes = keeper, {n.name: n for n in nodes}

    async def fence(self, shard: int, node: str, epoch: int) -> int | None:
        try:
            handle = await self._follower(shard, node)
            _, seq = await asyncio.wait_for(
                call_async(lambda: handle.fence.remote(epoch), NO_RETRY), FENCE_TIMEOUT_S)
            return seq
        except (RayqError, ray.exceptions.RayError, ValueError, asyncio.TimeoutError):
            return None

    async def _follower(self, shard: int, node: str):
        """The follower of ``shard`` on ``node`` (alive: a failover fences only those),
        started again on its copy when it does not run: a failover stopped it, then its
        manager was replaced before the new leader started. The copy on the node's disk
        is what counts, not the actor."""
        follower = start_follower(shard, self.nodes[node], self.keeper.data_dir,
                                  self.keeper.config)  # the running one, if it runs
        await asyncio.wait_for(call_async(lambda: follower.state.remote(), NO_RETRY),
                               FOLLOWER_START_S)
        return follower

    async def replace(self, old: ShardPlace, new: ShardPlace) -> None:
        await kill_named(shard_name(old.shard))
        await kill_named(follower_name(old.shard, new.leader))
        self.keeper.lead(new, self.nodes[new.leader])
