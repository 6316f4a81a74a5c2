"""A control store's leader side: every write set applied by the in-sync copies of
its place before the write returns, copies levelled or seeded, and the place changed
only by epochs this leader claims (docs/replication.md, "The control plane").

Control writes are rare (a queue created, an account, a rule, a signed control call's
nonce), so each ships as it commits, and a seeding copies the whole store while
writes wait: it is a few megabytes at most. The calls to the copies and to the GCS are
handed in (:class:`ControlPeers`): no Ray here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Protocol, TypeVar

from rayq.core.control.control_places import (ControlPlace, joined, leaving_copies, promoted,
                                              seed_target, without)
from rayq.core.replication.shard_places import count_missed, fence_reachable, missing, pings_counted
from rayq.core.kit.kv import LmdbKV, Txn, WriteSet, apply_writes
from rayq.core.storage.layout import REPLICA_KEY, read_replica_state, replica_state
from rayq.core.replication.replica import Replica
from rayq.errors import ReplicaBehind, StaleEpoch

log = logging.getLogger("rayq.control")
T = TypeVar("T")


class ControlPeers(Protocol):
    """What a control store's leader asks of the cluster; any failure raises."""

    def place(self, store: str) -> ControlPlace | None: ...
    def claim(self, place: ControlPlace) -> bool: ...
    def places(self) -> Mapping[str, ControlPlace]: ...
    def apply(self, node: str, store: str, epoch: int, seq: int, sets: list[WriteSet]) -> int: ...
    def state(self, node: str, store: str) -> tuple[int, int]: ...
    def install(self, node: str, store: str, data: bytes, epoch: int, seq: int) -> None: ...
    def start(self, node: str) -> None: ...
    def snapshot(self, kv: LmdbKV) -> bytes: ...


def copies_per_node(places: Mapping[str, ControlPlace]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for place in places.values():
        for node in place.in_sync:
            counts[node] = counts.get(node, 0) + 1
    return counts


class ControlReplication:
    """The store of a control actor (``kv``, its folder ``store`` on ``node``), kept on
    the in-sync copies of its place: :meth:`transact` returns once every one of them
    applied the write set. Reads stay local. With no place (no ``peers``: the embedded
    runtime; or never placed) it is ``kv`` alone."""

    def __init__(self, store: str, kv: LmdbKV, node: str, peers: ControlPeers | None):
        self.store, self.kv, self.node, self.peers = store, kv, node, peers
        self.place = None if peers is None else peers.place(store)
        if self.place is not None and self.place.leader != node:
            raise StaleEpoch(f"control store {store} is led from {self.place.leader} "
                             f"under epoch {self.place.epoch}, not from {node}")
        self.seq = read_replica_state(kv.read(lambda txn: txn.get("meta", REPLICA_KEY)))[1]
        self.refused: StaleEpoch | None = None  # set once a newer epoch replaced this leader
        self._synced: set[str] = set()  # copies known to hold every write set shipped
        self._unseeded: dict[str, int] = {}  # per node, seedings there that failed in a row
        self._lock = threading.RLock()  # one write, ship or seeding at a time

    # -- the KV surface the control code uses ----------------------------------------
    def read(self, fn: Callable[[Txn], T]) -> T:
        return self.kv.read(fn)

    def transact(self, fn: Callable[[Txn], T]) -> T:
        """Run ``fn`` in one write transaction, then have every in-sync copy apply it.
        Raises StaleEpoch when this leader was replaced (nothing it writes counts)."""
        if self.place is None:
            return self.kv.transact(fn)
        with self._lock:
            if self.refused is not None:
                raise self.refused
            written: list = []
            epoch, seq = self.place.epoch, self.seq + 1

            def stamped(txn: Txn) -> T:
                result = fn(txn)
                txn.put("meta", REPLICA_KEY, replica_state(epoch, seq))
                return result
            self.kv.watch(written.append)
            try:
                result = self.kv.transact(stamped)
            finally:
                self.kv.watch(None)
            self.seq = seq
            self._ship(tuple(w for writes in written for w in writes))
            return result

    def apply(self, writes) -> None:
        self.transact(lambda txn: apply_writes(txn, writes))

    def info(self) -> dict[str, int]:
        return self.kv.info()

    def close(self) -> None:
        self.kv.close()

    # -- shipping ----------------------------------------------------------------------
    def _ship(self, writes) -> None:
        for node in self.place.followers:
            if node not in self._synced:
                self._level(node)
                continue  # a seeding copies this write too
            try:
                applied = self.peers.apply(node, self.store, self.place.epoch, self.seq, [writes])
                if applied != self.seq:
                    raise ReplicaBehind(f"copy on {node} at {applied}, the leader at {self.seq}")
            except Exception as err:  # noqa: BLE001 - any failure: seed it or drop it
                self._failed(node, err)

    def _failed(self, node: str, err: BaseException) -> None:
        """The copy on ``node`` failed a write set: levelled when behind, else dropped.
        A copy fenced with a newer epoch (StaleEpoch) is dropped too, under the next
        epoch: when a failover claimed it, that claim fails and this leader refuses
        from then on; when none did (its watcher fenced the copies, then found none to
        promote), the store goes on without that copy instead of refusing forever."""
        log.warning("control store %s: copy on %s failed: %r", self.store, node, err)
        self._synced.discard(node)
        if isinstance(err, ReplicaBehind):
            self._level(node)
        else:
            self._drop(node)

    def _level(self, node: str) -> None:
        """Bring the copy on ``node`` level with this one: as it is if it already holds
        exactly this store's last write set, else seeded anew; dropped if that fails."""
        try:
            epoch, seq = self.peers.state(node, self.store)
            if epoch > self.place.epoch:  # fenced: dropped as in _failed
                raise StaleEpoch(f"copy on {node} holds epoch {epoch}")
            if seq != self.seq:
                self._seed(node)
            self._synced.add(node)
        except Exception as err:  # noqa: BLE001 - gone or too slow: out of sync
            log.warning("control store %s: copy on %s cannot be levelled: %r",
                        self.store, node, err)
            self._drop(node)

    def _seed(self, node: str) -> None:
        """Copy this store to ``node`` as of its last write set (writes wait meanwhile)."""
        self.peers.install(node, self.store, self.peers.snapshot(self.kv), self.place.epoch,
                           self.seq)
        log.warning("control store %s: copy seeded on %s at %d", self.store, node, self.seq)

    def _claim(self, place: ControlPlace) -> None:
        if place == self.place:
            return
        if not self.peers.claim(place):
            self._refuse(StaleEpoch(f"control store {self.store}: epoch {place.epoch} was "
                                    f"claimed by another leader"))
        self.place = place

    def _drop(self, node: str) -> None:
        self._synced.discard(node)
        self._claim(without(self.place, node))

    def _refuse(self, err: StaleEpoch) -> None:
        log.warning("control store %s on %s: replaced: %s", self.store, self.node, err)
        self.refused = err
        raise err

    # -- keeping the copies ------------------------------------------------------------
    def keep(self, alive: list[str], copies: int, draining: Collection[str] = ()) -> None:
        """One round: notice a newer epoch (this leader was replaced: refuse from now
        on), drop copies whose node is gone (or drains, once enough stay), level the
        others, and seed a copy on another node while fewer than ``copies`` are in sync
        on nodes that stay. The new copy's node is asked to start its follower first,
        while writes go on: a node that does not answer holds no write up."""
        if self.place is None:
            return
        with self._lock:
            if self.refused is not None:
                return
            latest = self.peers.place(self.store)
            if latest is not None and latest.epoch > self.place.epoch:
                self._refuse(StaleEpoch(f"control store {self.store}: epoch {latest.epoch} "
                                        f"leads from {latest.leader}"))
            for node in leaving_copies(self.place, alive, copies, draining):
                self._drop(node)
            for node in self.place.followers:
                if node not in self._synced:
                    self._level(node)
            target = seed_target(self.place, alive, copies, copies_per_node(self.peers.places()),
                                 draining, self._unseeded)
        if target is None or not self._seeded(target, lambda: self.peers.start(target)):
            return
        with self._lock:
            if self.refused is not None or target in self.place.in_sync:
                return
            if self.seq == 0:
                # a copy's first write set: no copy joins having applied none, so one at
                # 0 is a folder back empty, never promoted (control_places.promoted)
                self.transact(lambda txn: None)
            if self._seeded(target, lambda: self._seed(target)):
                self._unseeded.pop(target, None)
                self._synced.add(target)
                self._claim(joined(self.place, target))

    def _seeded(self, target: str, step: Callable[[], None]) -> bool:
        """Whether ``step`` of seeding a copy on ``target`` went through; a failure is
        counted, and the next round tries another node first."""
        try:
            step()
            return True
        except Exception as err:  # noqa: BLE001 - any failure: another node next round
            log.warning("control store %s: seeding a copy on %s failed: %r",
                        self.store, target, err)
            self._unseeded[target] = self._unseeded.get(target, 0) + 1
            return False



class FailoverPeers(Protocol):
    """What a watcher asks of the cluster to replace a control store's leader."""

    async def fence(self, node: str, store: str, epoch: int) -> int | None: ...
    def claim(self, place: ControlPlace) -> bool: ...
    async def replace(self, old: ControlPlace, new: ControlPlace) -> None: ...


async def fail_over(place: ControlPlace, alive: Collection[str], peers: FailoverPeers,
                    prefer: str | None = None) -> ControlPlace | None:
    """Replace ``place``'s leader: fence the reachable in-sync copies with the next epoch
    (``fence`` answers the last sequence number a copy applied, None if unreachable),
    claim that epoch with the copy that applied most as leader (:func:`promoted`), then
    stop the old control actor and start one on the new leader's node (``replace``).
    The new place, or None when no copy is reachable or another watcher claimed the
    epoch first."""
    applied = await fence_reachable(place.followers, alive,
                                    lambda n: peers.fence(n, place.store, place.epoch + 1))
    new = promoted(place, applied, prefer)
    if new is None:
        log.error("control store %s: leader on %s lost and no in-sync copy reachable",
                  place.store, place.leader)
        return None
    if not peers.claim(new):
        return None  # another watcher won this epoch
    log.warning("control store %s: leader on %s replaced; %s leads under epoch %d",
                place.store, place.leader, new.leader, new.epoch)
    await peers.replace(place, new)
    return new


class LeaderWatch:
    """A data node's watch over the leaders of the control stores it holds in-sync
    copies of: pings missed in a row per store, and a grace for a leader just placed
    (a new worker process and its store take a while to answer a first ping). A leader
    is just placed when its epoch changes under this watch, or when the watch itself
    started (``started``, monotonic) less than a grace ago: a runtime starting. A copy
    seeded onto this node later watches a leader that has long run: no grace."""

    def __init__(self, node: str, max_failed_pings: int, start_grace_s: float,
                 started: float):
        self.node, self.max_failed, self.grace_s = node, max_failed_pings, start_grace_s
        self._started = started
        self._missed: dict[str, int] = {}
        self._starting: dict[str, float] = {}
        self._epochs: dict[str, int] = {}

    def missing(self) -> bool:
        """Whether a leader missed its last ping without counting as lost yet: the next
        round should come soon."""
        return missing(self._missed, self.max_failed)

    def watches(self, place: ControlPlace | None) -> bool:
        """Whether this node watches ``place``'s leader: it holds an in-sync copy."""
        return place is not None and self.node in place.followers

    def lost(self, place: ControlPlace, alive: bool, answered: bool, now: float) -> bool:
        """Whether ``place``'s leader counts as lost after a round where its node was
        ``alive`` or not and its actor ``answered`` a ping or not (monotonic ``now``)."""
        store = place.store
        if self._epochs.get(store) != place.epoch:
            if store in self._epochs or now < self._started + self.grace_s:
                self._starting[store] = now + self.grace_s
            else:
                self._starting.pop(store, None)
            self._epochs[store] = place.epoch
            self._missed[store] = 0
        counted, self._starting = pings_counted({store: answered}, self._starting, now)
        self._missed.update(count_missed(self._missed, counted))
        return not alive or self._missed[store] >= self.max_failed


async def watch_round(watch: LeaderWatch, places: Mapping[str, ControlPlace | None],
                      staying: Callable[[], Collection[str]],
                      hands_over: Callable[[ControlPlace], bool],
                      answers: Callable[[str], Awaitable[bool]],
                      replace: Callable[[ControlPlace, Collection[str]], Awaitable],
                      now: float) -> None:
    """One round of a watcher: each store whose in-sync copy it holds has its leader
    checked: its actor ``answers(store)`` a ping (every store's at once), and only when
    it does not (or it ``hands_over``: its node drains and enough copies stay), whether
    its node is among the alive nodes that stay (``staying()``, asked once a round at
    most: it is Ray's node table). A lost leader is replaced (``replace(place,
    staying)``: :func:`fail_over`)."""
    watched = {store: place for store, place in places.items() if watch.watches(place)}
    pinged = [store for store, place in watched.items() if not hands_over(place)]
    answered_by = dict(zip(pinged, await asyncio.gather(*(answers(s) for s in pinged))))
    nodes: Collection[str] | None = None
    for store, place in watched.items():
        answered = answered_by.get(store, False)
        if not answered and nodes is None:
            nodes = staying()
        up = answered or place.leader in nodes
        if watch.lost(place, up, answered, now):
            await replace(place, nodes if nodes is not None else staying())


class Copies:
    """A data node's copies of the control stores it follows, each opened at its first
    use (``open_copy(store)``) and closed when its store's leader moves onto this node."""

    def __init__(self, open_copy: Callable[[str], Replica]):
        self._open = open_copy
        self._copies: dict[str, Replica] = {}

    def __getitem__(self, store: str) -> Replica:
        copy = self._copies.get(store)
        if copy is None:
            copy = self._copies[store] = self._open(store)
        return copy

    def release(self, store: str) -> None:
        copy = self._copies.pop(store, None)
        if copy is not None:
            copy.kv.close()
