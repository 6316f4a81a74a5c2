"""A deterministic simulation of the control stores' replication (docs/replication.md,
"The control plane" and "Recovery never loses data"), in the manner of FoundationDB's
and TigerBeetle's simulators: one thread, one seeded scheduler, every fault replayable.

The cluster: data nodes n1..n5, each with a disk (a :class:`~rayq.testing.MemoryKV` per
control store folder, kept across crashes) and, while it runs, a control follower (the
node's copies, and its watcher: :class:`LeaderWatch` rounds that call :func:`fail_over`)
and the control actors placed on it (:class:`ControlReplication`, on the node's folder
of its store, as ``actors.control`` runs them). A GCS holds the claims (a key written
only if absent) and the actors' names. Processes call each other only through
:meth:`World.call`, where the scheduler drops a call, times it out (run anyway, run
later or never), or runs other steps while it is in flight: a watcher fails the caller
over, the caller's node stalls, crashes or reboots, the callee's node crashes.

A step is one of: a client write (it allocates the next id of a counter in the store
and is acknowledged when ``transact`` returns), a leader's ``keep`` round, watchers'
rounds, a late call delivered, a node crashed (memory lost, disk kept), restarted
(another Ray node under the same name: what ran there does not come back until a
leader starts a follower there), brought back empty (disk wiped), rebooted (Ray
restarts its processes on the same node), paused or resumed, a link cut or healed.
Time is a :class:`FakeClock` the scheduler advances; the weather (how often each
fault strikes) is drawn per seed.

:class:`Oracle` checks the invariants after every step and at every claim; at the end
the faults stop, and every store must settle by itself (or after a runtime start, for
a store no control actor runs for) with every in-sync copy equal to its leader. A
violation raises :class:`SimulationFailure` with the seed and the trace of events, and
``simulate(seed, ...)`` replays it exactly::

    python -m tests.unit.simulation 1234 --stores manager,coordinator,flood
    python -m tests.unit.simulation --seeds 0:20000
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import logging
import pickle
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from rayq.core.control.control_places import CONTROL_STORES, ControlPlace, starting_places
from rayq.core.control.control_store import (ControlReplication, Copies, LeaderWatch, fail_over,
                                             watch_round)
from rayq.core.kit.clock import FakeClock
from rayq.core.kit.kv import DATABASES, Txn
from rayq.core.storage.layout import REPLICA_KEY, read_replica_state
from rayq.core.replication.replica import Replica, check_epoch
from rayq.errors import RayqError
from rayq.testing import MemoryKV

T = TypeVar("T")
NODES = tuple(f"n{i}" for i in range(1, 6))
MAX_FAILED_PINGS = 3     # as actors.control counts them
START_GRACE_S = 8.0      # the watchers' grace for a leader just placed (short: seeds are short)
MAX_NESTING = 2          # steps run inside a call in flight, at most this deep
HEAL_ROUNDS = 40         # quiet rounds to settle in, before and after a runtime start
TRACE_LINES = 400        # the end of the trace a failure shows
COUNTER = b"sim:next-id"
# What a call can fail with, as a caller sees it; anything else (a TypeError) is a bug of
# the simulation or of the code under test, and fails the seed at once.
FAILURES = (ConnectionError, TimeoutError, RayqError)


class SimulationFailure(BaseException):
    """Raised when an invariant breaks: the message names the seed and holds the end of
    the trace (``outcome.trace``: all of it). Not an Exception: the code under test
    catches those around its calls."""

    def __init__(self, message: str, outcome: Outcome):
        super().__init__(message)
        self.outcome = outcome


class Crashed(BaseException):
    """Raised inside a process that died (its node crashed, or it was killed) at its next
    call: nothing in the code under test catches it, only the boundary of the process."""

    def __init__(self, proc: Proc):
        super().__init__(proc.name)
        self.proc = proc


class NodeState(enum.Enum):
    UP = "up"
    PAUSED = "paused"   # in Ray's node list, but its processes answer nothing
    DOWN = "down"


@dataclass(eq=False)
class Proc:
    """One process: a node's control follower or a control actor."""

    name: str
    node: str
    alive: bool = True


@dataclass(frozen=True)
class Faults:
    """A seed's weather: how often a call fails, and how often nodes and links do."""

    drop: float          # a call refused at once (the actor is unreachable)
    late: float          # a call times out and runs later
    lost_reply: float    # a call runs, its answer is lost (the caller times out)
    nest: float          # other steps run while a call is in flight
    zombie: float        # a kill misses its process (it runs on, nameless)
    disrupt: float       # the weight of node and link faults among the steps

    @classmethod
    def draw(cls, rng: random.Random) -> Faults:
        pick = rng.choice
        return cls(drop=pick((0.0, 0.02, 0.1)), late=pick((0.0, 0.02, 0.1)),
                   lost_reply=pick((0.0, 0.02, 0.1)), nest=pick((0.0, 0.05, 0.2)),
                   zombie=pick((0.0, 0.0, 0.3)), disrupt=pick((0.5, 1.0, 3.0)))


    def spec(self) -> str:
        """The weather as ``--weather`` takes it."""
        return ",".join(f"{name}={value}" for name, value in vars(self).items())

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """``drop=0.1,late=0.2,...`` (every field)."""
        return cls(**{k: float(v) for k, v in (item.split("=") for item in spec.split(","))})


CALM = Faults(drop=0.0, late=0.0, lost_reply=0.0, nest=0.0, zombie=0.0, disrupt=0.0)


# -- the data: an id counter, and each write's value under its id ----------------------------
def id_key(ident: int) -> bytes:
    return b"id:%08d" % ident


def allocate(payload: bytes) -> Callable[[Txn], int]:
    """A client's write: the next id of the store's counter, the payload under it, and the
    payload's own key (so a write that reached only some copies shows as a difference)."""
    def write(txn: Txn) -> int:
        ident = int(txn.get("meta", COUNTER) or b"0")
        txn.put("meta", COUNTER, b"%d" % (ident + 1))
        txn.put("keys", id_key(ident), payload)
        txn.put("keys", b"w:" + payload, b"%d" % ident)
        return ident
    return write


def contents(kv: MemoryKV) -> dict[str, dict[bytes, bytes]]:
    """Every table of ``kv`` but its replica state (epoch and sequence differ by copy)."""
    def dump(txn: Txn) -> dict[str, dict[bytes, bytes]]:
        tables = {db: dict(txn.scan(db, b"")) for db in DATABASES}
        tables["meta"].pop(REPLICA_KEY, None)
        return tables
    return kv.read(dump)


def holds(kv: MemoryKV, acked: dict[int, bytes]) -> bool:
    """Whether ``kv`` holds every acknowledged write (id -> payload)."""
    return kv.read(lambda txn: all(txn.get("keys", id_key(i)) == p for i, p in acked.items()))


def replica_of(kv: MemoryKV) -> tuple[int, int]:
    """(epoch, last sequence number) the folder ``kv`` holds."""
    return read_replica_state(kv.read(lambda txn: txn.get("meta", REPLICA_KEY)))


def snapshot(kv: MemoryKV) -> bytes:
    """The whole store as bytes, as of one read (what ``install`` receives)."""
    return pickle.dumps(kv.read(lambda txn: {db: list(txn.scan(db, b"")) for db in DATABASES}))


def restore(data: bytes) -> MemoryKV:
    tables = pickle.loads(data)
    kv = MemoryKV()
    kv.transact(lambda txn: [txn.putmulti(db, rows) for db, rows in tables.items()])
    return kv


# -- the processes -------------------------------------------------------------------------
class Node:
    """A data node: its disk outlives crashes; what runs on it does not."""

    def __init__(self, name: str):
        self.name, self.state, self.boot = name, NodeState.UP, 0
        self.disk: dict[str, MemoryKV] = {}
        self.blank: set[str] = set()   # folders wiped and not seeded since
        self.follower: Follower | None = None

    def folder(self, store: str) -> MemoryKV:
        return self.disk.setdefault(store, MemoryKV())


class Follower:
    """A node's control follower, keeping its copies as ``actors.control`` does, and its
    watcher's state."""

    def __init__(self, node: Node, now: float):
        self.node = node
        self.proc = Proc(f"rayq-control-{node.name}", node.name)
        self.copies = Copies(lambda store: Replica(node.folder(store)))
        self.watch = LeaderWatch(node.name, MAX_FAILED_PINGS, START_GRACE_S, now)

    def apply(self, store, epoch, first_seq, sets) -> int:
        return self.copies[store].apply(epoch, first_seq, sets)

    def fence(self, store: str, epoch: int) -> tuple[int, int]:
        return self.copies[store].fence(epoch)

    def state(self, store: str) -> tuple[int, int]:
        copy = self.copies[store]
        return copy.epoch, copy.seq

    def install(self, store: str, data: bytes, epoch: int, seq: int) -> int:
        """The leader's copy replaces this one (a fuller one is moved aside, never
        deleted: gone from the store either way); refused with StaleEpoch when this copy
        holds a newer epoch (a replaced leader's late seed)."""
        check_epoch(self.copies[store].epoch, epoch, "seed")
        self.copies.release(store)
        self.node.disk[store] = restore(data)
        self.node.blank.discard(store)
        self.copies[store].install(epoch, seq)
        return seq

    def release(self, store: str) -> None:
        self.copies.release(store)


class Leader:
    """A control actor: its store, on its node's folder, kept on the place's copies."""

    def __init__(self, world: World, node: Node, store: str):
        self.store = store
        self.proc = Proc(f"{store}@{node.name}.{world.serial()}", node.name)
        self.rep = ControlReplication(store, node.folder(store), node.name,
                                      LeaderPeers(world, self.proc))


class LeaderPeers:
    """:class:`~rayq.core.control.control_store.ControlPeers` of one leader process."""

    def __init__(self, world: World, proc: Proc):
        self.world, self.proc = world, proc

    def place(self, store: str) -> ControlPlace | None:
        return self.world.gcs.place(store)

    def claim(self, place: ControlPlace) -> bool:
        return self.world.claim(place, self.proc)

    def places(self) -> dict[str, ControlPlace]:
        return self.world.gcs.places()

    def apply(self, node, store, epoch, seq, sets) -> int:
        return self.world.call_follower(self.proc, node, f"apply {store}@{epoch}#{seq}",
                                        lambda f: f.apply(store, epoch, seq, sets))

    def state(self, node: str, store: str) -> tuple[int, int]:
        return self.world.call_follower(self.proc, node, f"state {store}",
                                        lambda f: f.state(store))

    def install(self, node, store, data, epoch, seq) -> None:
        self.world.call_follower(self.proc, node, f"install {store}@{epoch}#{seq}",
                                 lambda f: f.install(store, data, epoch, seq))

    def start(self, node: str) -> None:
        self.world.start_follower(self.proc, node)

    @staticmethod
    def snapshot(kv: MemoryKV) -> bytes:
        return snapshot(kv)


class WatcherPeers:
    """:class:`~rayq.core.control.control_store.FailoverPeers` of one watcher's round
    (``boots``: the alive nodes as the round found them, as Ray node ids are). Every
    copy is called by its follower's name, the watcher's own too."""

    def __init__(self, world: World, follower: Follower, boots: dict[str, int]):
        self.world, self.boots, self.proc = world, boots, follower.proc

    async def fence(self, node: str, store: str, epoch: int) -> int | None:
        try:
            return self.world.call_follower(self.proc, node, f"fence {store}@{epoch}",
                                            lambda f: f.fence(store, epoch))[1]
        except FAILURES:
            return None

    def claim(self, place: ControlPlace) -> bool:
        return self.world.claim(place, self.proc)

    async def replace(self, old: ControlPlace, new: ControlPlace) -> None:
        """Kill the old actor, release the new leader's copy, start the actor there."""
        self.world.kill_leader(old.store)
        self.world.call_follower(self.proc, new.leader, f"release {old.store}",
                                 lambda f: f.release(old.store))
        self.world.launch(old.store, new.leader, self.boots[new.leader])


class Gcs:
    """Ray's GCS as the control plane uses it: claims written only if absent."""

    def __init__(self, stores: tuple[str, ...]):
        self.claims: dict[str, dict[int, ControlPlace]] = {s: {} for s in stores}

    def place(self, store: str) -> ControlPlace | None:
        claims = self.claims[store]
        return claims[max(claims)] if claims else None

    def places(self) -> dict[str, ControlPlace]:
        return {s: p for s in self.claims if (p := self.place(s)) is not None}


@dataclass
class Deferred:
    """A call that timed out for its caller and runs later: either received and queued
    behind a paused or slow callee (``queued``: calls to it run in the order it received
    them, whoever sent them), or held up in the network (run in the order their caller
    sent them, lost if that caller dies first, and overtaken by other callers' calls)."""

    caller: Proc | None
    callee: Proc
    what: str
    op: Callable[[], object]
    queued: bool

    def ahead_of(self, caller: Proc | None, callee: Proc) -> bool:
        """Whether a new call from ``caller`` to ``callee`` waits behind this one."""
        return self.callee is callee and (self.queued or self.caller is caller)

    def order(self) -> tuple:
        """Late calls of one order run oldest first."""
        return (id(self.callee),) if self.queued else (id(self.callee), id(self.caller))


@dataclass(frozen=True)
class Ack:
    """An acknowledged write: ``transact`` returned ``ident`` to the client."""

    store: str
    ident: int
    payload: bytes
    epoch: int          # of the leader's place as the write returned
    node: str           # the leader's
    claims_before: int  # claims made before the write was sent


@dataclass
class Outcome:
    """What a seed did: the trace, and counts the tests check the seeds reach."""

    seed: int
    trace: list[str] = field(default_factory=list)
    acked: int = 0
    claims: int = 0
    failovers: int = 0   # leaders a watcher replaced
    wiped: int = 0
    runtime_started: bool = False


# -- the invariants ------------------------------------------------------------------------
class Oracle:
    """What must hold whatever the faults:

    - nothing acknowledged is lost: every in-sync copy of each store's newest place holds
      every acknowledged write (but a folder wiped and not seeded since), and one of them
      always does; once settled, every in-sync copy equals its leader's store;
    - one writer per epoch: the writes acknowledged under an epoch all come from one
      node, and none under an epoch older than one another process claimed before the
      write was sent (a deposed leader refuses with StaleEpoch);
    - claimed epochs increase one by one;
    - a copy back empty never leads while a fuller in-sync copy exists: a claimed place
      and a started control actor lead from a copy holding every acknowledged write
      whenever some in-sync copy does;
    - no id is acknowledged twice.
    """

    def __init__(self, world: World):
        self.world = world
        self.acked: dict[str, dict[int, bytes]] = {s: {} for s in world.stores}
        self.acks: list[Ack] = []
        self.claims: dict[tuple[str, int], tuple[int, str]] = {}  # -> (order, claimer)

    def full(self, name: str, store: str) -> bool:
        node = self.world.nodes[name]
        return store in node.disk and holds(node.disk[store], self.acked[store])

    def acknowledged(self, ack: Ack) -> None:
        acked = self.acked[ack.store]
        if ack.ident in acked:
            self.world.fail(f"id {ack.ident} of {ack.store} acknowledged twice: "
                            f"{acked[ack.ident]!r} and {ack.payload!r}")
        acked[ack.ident] = ack.payload
        self.acks.append(ack)
        for (store, epoch), (order, who) in self.claims.items():
            if store == ack.store and epoch > ack.epoch and order < ack.claims_before:
                self.world.fail(f"{ack.payload!r} acknowledged under epoch {ack.epoch} "
                                f"after {who} claimed epoch {epoch}")
        writers = {a.node for a in self.acks if a.store == ack.store and a.epoch == ack.epoch}
        if len(writers) > 1:
            self.world.fail(f"{ack.store}: writes acknowledged under epoch {ack.epoch} "
                            f"by {sorted(writers)}")

    def claimed(self, place: ControlPlace, before: ControlPlace | None, who: Proc) -> None:
        if before is not None and place.epoch != before.epoch + 1:
            self.world.fail(f"{place.store}: epoch {place.epoch} claimed after {before.epoch}")
        self.claims[(place.store, place.epoch)] = (len(self.claims), who.name)
        if before is None or self.full(place.leader, place.store):
            return
        fuller = [n for n in before.in_sync + place.in_sync if self.full(n, place.store)]
        if fuller:
            self.world.fail(f"{place.store}: {place.leader} leads epoch {place.epoch} "
                            f"lacking acknowledged writes that {fuller[0]} holds")

    def launched(self, leader: Leader) -> None:
        if not holds(leader.rep.kv, self.acked[leader.store]):
            self.world.fail(f"{leader.proc.name} started on a copy lacking acknowledged writes")

    def after_step(self) -> None:
        for store in self.world.stores:
            place = self.world.gcs.place(store)
            for name in place.in_sync:
                if store not in self.world.nodes[name].blank and not self.full(name, store):
                    self.world.fail(f"{store}: the copy on {name}, in sync under epoch "
                                    f"{place.epoch}, lacks acknowledged writes")
            if not any(self.full(n, store) for n in place.in_sync):
                self.world.fail(f"{store}: no in-sync copy holds every acknowledged write")

    def settled(self) -> None:
        for store in self.world.stores:
            leader = self.world.actors[store]
            want = contents(leader.rep.kv)
            for name in leader.rep.place.followers:
                kv = self.world.nodes[name].folder(store)
                if contents(kv) != want or replica_of(kv)[1] != leader.rep.seq:
                    self.world.fail(f"{store}: the copy on {name} differs from its leader's "
                                    f"({replica_of(kv)}, the leader at {leader.rep.seq})")


# -- the world -----------------------------------------------------------------------------
class World:
    """The simulated cluster and its scheduler (see the module's docstring)."""

    def __init__(self, seed: int, *, stores: tuple[str, ...] = ("manager",), steps: int = 60,
                 weather: Faults | None = None):
        self.seed, self.rng = seed, random.Random(seed)
        self.stores, self.steps = stores, steps
        drawn = Faults.draw(self.rng)  # drawn even when given: the rest of the seed is the same
        self.weather = self.faults = weather or drawn
        self.copies = self.rng.choice((2, 3))
        self.clock = FakeClock()
        self.nodes = {name: Node(name) for name in NODES}
        self.gcs = Gcs(stores)
        self.actors: dict[str, Leader] = {}   # the named control actor of each store
        self.leaders: list[Leader] = []       # every control actor process, named or not
        self.deferred: list[Deferred] = []
        self.cut: set[tuple[str, str]] = set()
        self.oracle = Oracle(self)
        self.outcome = Outcome(seed)
        self.written = 0
        self.acked_last: list[bool] = []  # each store's write of the last quiet round
        self.stack: list[Proc] = []   # the processes in a call, outermost first
        self.depth = 0                # how deep the current step is nested in calls
        self._serial = 0
        self._loops: list[asyncio.AbstractEventLoop] = []

    # -- bookkeeping -------------------------------------------------------------------
    def serial(self) -> int:
        self._serial += 1
        return self._serial

    def log(self, event: str) -> None:
        self.outcome.trace.append(f"{self.clock.monotonic():7.1f} {'  ' * self.depth}{event}")

    def fail(self, what: str) -> None:
        trace = "\n".join(self.outcome.trace[-TRACE_LINES:])
        raise SimulationFailure(
            f"seed {self.seed}: {what}\n"
            f"replay: python -m tests.unit.simulation {self.seed} --stores "
            f"{','.join(self.stores)} --steps {self.steps} --weather {self.weather.spec()}\n"
            f"copies: {self.copies}\n{trace}", self.outcome)

    def alive(self) -> dict[str, int]:
        """The nodes in Ray's node list (paused ones too), with their boot."""
        return {n.name: n.boot for n in self.nodes.values() if n.state is not NodeState.DOWN}

    def run_async(self, coro) -> T:
        """Run ``coro`` to its end. A step nested in a call may run another watcher's
        round inside this one's, so each depth has a loop of its own."""
        while len(self._loops) <= self.depth:
            self._loops.append(asyncio.new_event_loop())
        outer = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        try:
            return self._loops[self.depth].run_until_complete(coro)
        finally:
            asyncio.events._set_running_loop(outer)

    def close(self) -> None:
        for loop in self._loops:
            loop.close()

    def faulty(self, kind: str) -> bool:
        return self.rng.random() < getattr(self.faults, kind)

    # -- calls between processes -------------------------------------------------------
    def check_alive(self, proc: Proc | None) -> None:
        if proc is not None and not proc.alive:
            raise Crashed(proc)

    def call(self, caller: Proc | None, callee: Proc | None, what: str,
             op: Callable[[], T]) -> T:
        """``op`` run by ``callee`` for ``caller`` (None: a client outside the cluster),
        through the faults: ConnectionError when refused, TimeoutError when no answer
        came (``op`` then ran, runs later, or never)."""
        self.nest(caller)
        self.check_alive(caller)
        if callee is None or not callee.alive or self.nodes[callee.node].state is NodeState.DOWN:
            raise ConnectionError(f"{what}: no process")
        if caller is not None and self.is_cut(caller.node, callee.node):
            raise TimeoutError(f"{what}: link cut")
        if self.faulty("drop"):
            raise ConnectionError(f"{what}: dropped")
        paused = self.nodes[callee.node].state is NodeState.PAUSED
        behind = [c for c in self.deferred if c.ahead_of(caller, callee)]
        if behind or paused or self.faulty("late"):
            queued = behind[-1].queued if behind else paused or self.rng.random() < 0.5
            self.deferred.append(Deferred(caller, callee, what, op, queued))
            raise TimeoutError(f"{what}: timed out, runs later")
        result = self.run_as(callee, op)
        if self.faulty("lost_reply"):
            self.log(f"{what}: reply lost")
            raise TimeoutError(f"{what}: reply lost")
        self.nest(caller, callee)
        self.check_alive(caller)
        return result

    def run_as(self, proc: Proc, op: Callable[[], T]) -> T:
        self.stack.append(proc)
        try:
            return op()
        except Crashed as crash:
            if crash.proc is proc:
                raise ConnectionError(f"{proc.name} died in the call") from None
            raise
        finally:
            self.stack.pop()

    def call_follower(self, caller: Proc, node: str, what: str,
                      op: Callable[[Follower], T]) -> T:
        follower = self.nodes[node].follower
        return self.call(caller, follower and follower.proc, f"{what} -> {node}",
                         lambda: op(follower))

    def is_cut(self, a: str, b: str) -> bool:
        return (min(a, b), max(a, b)) in self.cut

    def nest(self, caller: Proc | None, callee: Proc | None = None) -> None:
        """Maybe run other steps while ``caller``'s call is in flight (``callee``: the
        call already ran there): its node stalls, crashes or reboots, the callee's node
        crashes, or steps the scheduler picks run."""
        if self.depth >= MAX_NESTING or not self.faulty("nest"):
            return
        self.depth += 1
        try:
            pick = self.rng.random()
            if caller is not None and pick < 0.3:
                self.stall(caller.node)
            elif caller is not None and pick < 0.4:
                self.crash_some(caller.node)
            elif caller is not None and pick < 0.45:
                self.reboot(caller.node)
            elif callee is not None and pick < 0.55:
                self.crash_some(callee.node)
            else:
                for _ in range(self.rng.randint(1, 3)):
                    self.step()
        finally:
            self.depth -= 1

    def stall(self, name: str) -> None:
        """The caller's node stops for a while (steps run meanwhile), then goes on."""
        node = self.nodes[name]
        if node.state is not NodeState.UP:
            return
        self.log(f"stall {name}")
        node.state = NodeState.PAUSED
        for _ in range(self.rng.randint(1, 4)):
            self.step()
        if node.state is NodeState.PAUSED:
            self.resume(name)

    # -- the GCS and the actors' names -------------------------------------------------
    def claim(self, place: ControlPlace, who: Proc) -> bool:
        """Write ``place``'s claim if its epoch is free (checked by the oracle)."""
        if place.epoch in self.gcs.claims[place.store]:
            self.log(f"claim {place.store}@{place.epoch} {place.in_sync} by {who.name}: taken")
            return False
        before = self.gcs.place(place.store)
        self.gcs.claims[place.store][place.epoch] = place
        self.outcome.claims += 1
        self.log(f"claim {place.store}@{place.epoch} {place.in_sync} by {who.name}")
        self.oracle.claimed(place, before, who)
        return True

    def kill_leader(self, store: str) -> None:
        """Kill ``store``'s named actor; the kill may miss its process (a zombie)."""
        leader = self.actors.pop(store, None)
        if leader is None:
            return
        if leader.proc.alive and self.faulty("zombie"):
            self.log(f"kill {leader.proc.name}: missed, it runs on")
            return
        self.log(f"kill {leader.proc.name}")
        leader.proc.alive = False

    def launch(self, store: str, name: str, boot: int) -> None:
        """Start ``store``'s control actor on node ``name`` as it was at ``boot``: a node
        restarted since is another Ray node, and the actor never starts."""
        node = self.nodes[name]
        if node.state is NodeState.DOWN or node.boot != boot or store in self.actors:
            self.log(f"launch {store} on {name}: cannot start")
            return
        try:
            leader = Leader(self, node, store)
        except FAILURES as err:  # the actor fails to start
            self.log(f"launch {store} on {name}: {err!r}")
            return
        self.actors[store] = leader
        self.leaders.append(leader)
        self.log(f"launch {leader.proc.name} at seq {leader.rep.seq}")
        self.oracle.launched(leader)

    def start_follower(self, caller: Proc, name: str) -> None:
        """A node's control follower, started unless it runs; waited for like a call."""
        node = self.nodes[name]
        if node.state is not NodeState.UP:
            raise TimeoutError(f"start follower on {name}: node {node.state.value}")
        if node.follower is None:
            node.follower = Follower(node, self.clock.monotonic())
            self.log(f"start follower on {name}")
        self.call(caller, node.follower.proc, f"ping follower {name}", lambda: True)

    # -- node faults -------------------------------------------------------------------
    def crash(self, name: str) -> None:
        node = self.nodes[name]
        self.log(f"crash {name}")
        node.state = NodeState.DOWN
        for proc in self.procs_on(name):
            proc.alive = False
        node.follower = None
        for store, leader in list(self.actors.items()):
            if leader.proc.node == name:
                del self.actors[store]

    def restart(self, name: str, *, empty: bool = False) -> None:
        """The node is back under its name (another Ray node: nothing runs on it yet),
        with its disk or, ``empty``, with a blank one."""
        node = self.nodes[name]
        if node.state is not NodeState.DOWN:
            self.crash(name)
        if empty:
            node.disk, node.blank = {}, set(self.stores)
            self.outcome.wiped += 1
        node.state, node.boot = NodeState.UP, node.boot + 1
        self.log(f"restart {name}{' empty' if empty else ''}")

    def reboot(self, name: str) -> None:
        """Every process of the node dies and Ray restarts them on the same node: the
        follower, and the control actors named there (each opens its folder again)."""
        node = self.nodes[name]
        self.log(f"reboot {name}")
        for proc in self.procs_on(name):
            proc.alive = False
        if node.follower is not None:
            node.follower = Follower(node, self.clock.monotonic())
        for store, leader in list(self.actors.items()):
            if leader.proc.node == name:
                del self.actors[store]
                self.launch(store, name, node.boot)

    def pause(self, name: str) -> None:
        self.log(f"pause {name}")
        self.nodes[name].state = NodeState.PAUSED

    def resume(self, name: str) -> None:
        """The node goes on, and its processes first run the calls queued for them."""
        self.log(f"resume {name}")
        self.nodes[name].state = NodeState.UP
        for call in [c for c in self.deferred if c.queued and c.callee.node == name]:
            if call in self.deferred and not self.busy(call.callee):
                self.run_late(call)

    def procs_on(self, name: str) -> list[Proc]:
        procs = [leader.proc for leader in self.leaders if leader.proc.node == name]
        follower = self.nodes[name].follower
        return procs + ([follower.proc] if follower is not None else [])

    def may_wipe(self, name: str) -> bool:
        """Whether node ``name``'s disk may go: only while, for every store, another
        in-sync copy holds every acknowledged write (nothing acknowledged is lost while
        one in-sync copy survives: the promise under test)."""
        return all(any(n != name and self.oracle.full(n, store)
                       for n in self.gcs.place(store).in_sync) for store in self.stores)

    # -- what the processes do ---------------------------------------------------------
    def busy(self, proc: Proc) -> bool:
        """Whether ``proc`` is in a call (its lock would hold another one back)."""
        return proc in self.stack

    def running(self, proc: Proc) -> bool:
        return proc.alive and self.nodes[proc.node].state is NodeState.UP

    def write(self, store: str) -> bool:
        """A client writes the next numbered value to ``store``'s named actor; whether
        the write was acknowledged (``transact`` returned)."""
        leader = self.actors.get(store)
        if leader is not None and self.busy(leader.proc):
            return False
        self.written += 1
        payload = b"%s-%d" % (store.encode(), self.written)
        claims_before = self.outcome.claims
        try:
            ident = self.call(None, leader and leader.proc, f"write {payload.decode()}",
                              lambda: leader.rep.transact(allocate(payload)))
        except FAILURES as err:  # not acknowledged: the client goes on
            self.log(f"write {payload.decode()}: {err!r}"[:160])
            return False
        epoch = leader.rep.place.epoch
        self.log(f"write {payload.decode()}: id {ident} at {epoch}#{leader.rep.seq} "
                 f"by {leader.proc.name}")
        self.outcome.acked += 1
        self.oracle.acknowledged(Ack(store, ident, payload, epoch, leader.proc.node,
                                     claims_before))
        return True

    def keep(self, leader: Leader) -> None:
        """One ``keep`` round of a control actor (a zombie's too)."""
        if not self.running(leader.proc) or self.busy(leader.proc):
            return
        self.log(f"keep {leader.proc.name}")
        with self.round_of(leader.proc, f"keep {leader.proc.name}"):
            leader.rep.keep(list(self.alive()), self.copies)

    def watch(self, name: str) -> None:
        """One watcher round on node ``name``: ``watch_round`` with pings through the
        faults and :func:`fail_over` through :class:`WatcherPeers`."""
        follower = self.nodes[name].follower
        if follower is None or not self.running(follower.proc) or self.busy(follower.proc):
            return
        boots = self.alive()
        peers = WatcherPeers(self, follower, boots)

        async def answers(store: str) -> bool:
            leader = self.actors.get(store)
            try:
                return self.call(follower.proc, leader and leader.proc, f"ping {store}",
                                 lambda: True)
            except (ConnectionError, TimeoutError):
                return False

        async def replace(place: ControlPlace, alive) -> None:
            self.log(f"{name} fails over {place.store}@{place.epoch} {place.in_sync}")
            if await fail_over(place, alive, peers, prefer=name) is not None:
                self.outcome.failovers += 1

        with self.round_of(follower.proc, f"watch {name}"):
            self.run_async(watch_round(follower.watch, self.gcs.places(), lambda: boots,
                                       lambda place: False, answers, replace,
                                       self.clock.monotonic()))

    @contextmanager
    def round_of(self, proc: Proc, what: str) -> Iterator[None]:
        """A round ``proc`` runs by itself, in a call meanwhile: its death ends it, and
        so does a call that failed (the next round tries again)."""
        self.stack.append(proc)
        try:
            yield
        except Crashed as crash:
            if crash.proc is not proc:
                raise
        except FAILURES as err:
            self.log(f"{what}: {err!r}"[:160])
        finally:
            self.stack.pop()

    def deliver(self) -> bool:
        """Run one late call, the first of its order (:class:`Deferred`), whose callee
        runs and is in no call; drop those whose callee died, or whose caller died while
        they were in the network. Whether one ran."""
        self.deferred = [c for c in self.deferred if c.callee.alive and
                         (c.queued or c.caller is None or c.caller.alive)]
        firsts: dict[tuple, Deferred] = {}
        for call in self.deferred:
            firsts.setdefault(call.order(), call)
        ready = [c for c in firsts.values() if self.running(c.callee) and not self.busy(c.callee)]
        if ready:
            self.run_late(self.rng.choice(ready))
        return bool(ready)

    def run_late(self, call: Deferred) -> None:
        self.deferred.remove(call)
        if not call.callee.alive:
            return
        self.log(f"late {call.what}")
        try:
            self.run_as(call.callee, call.op)
        except FAILURES as err:  # nobody waits for the answer
            self.log(f"late {call.what}: {err!r}"[:160])

    # -- the scheduler -----------------------------------------------------------------
    def step(self) -> None:
        """One step the scheduler picks (nested inside a call when ``depth`` > 0), then
        the invariants."""
        self.clock.advance(self.rng.uniform(0.1, 1.5))
        weights, actions = zip(*self.choices())
        self.rng.choices(actions, weights)[0]()
        self.oracle.after_step()

    def choices(self) -> list[tuple[float, Callable[[], object]]]:
        rng, live = self.rng, [leader for leader in self.leaders if leader.proc.alive]
        disrupt = self.faults.disrupt
        return [(6, lambda: self.write(rng.choice(self.stores))),
                (2, lambda: live and self.keep(rng.choice(live))),
                (1, lambda: [self.keep(leader) for leader in rng.sample(live, len(live))]),
                (2, lambda: self.watch(rng.choice(NODES))),
                (2, lambda: [self.watch(name) for name in rng.sample(NODES, len(NODES))]),
                (2, self.deliver),
                (0.4 * disrupt, self.crash_some),
                (1.0 * disrupt, self.restart_some),
                (0.3 * disrupt, lambda: self.reboot(rng.choice(NODES))
                 if self.nodes_in(NodeState.UP) else None),
                (0.5 * disrupt, lambda: self.pause(rng.choice(self.nodes_in(NodeState.UP)))
                 if self.nodes_in(NodeState.UP) else None),
                (0.8 * disrupt, lambda: self.resume(rng.choice(self.nodes_in(NodeState.PAUSED)))
                 if self.nodes_in(NodeState.PAUSED) else None),
                (0.4 * disrupt, self.cut_some),
                (0.6 * disrupt, self.heal_some)]

    def nodes_in(self, state: NodeState) -> list[str]:
        return [n for n in NODES if self.nodes[n].state is state]

    def crash_some(self, name: str | None = None) -> None:
        """Crash node ``name`` (None: any), while more than three are in Ray's list."""
        alive = list(self.alive())
        if len(alive) > 3 and (name is None or name in alive):
            self.crash(name or self.rng.choice(alive))

    def restart_some(self) -> None:
        down = self.nodes_in(NodeState.DOWN)
        if down:
            name = self.rng.choice(down)
            self.restart(name, empty=self.rng.random() < 0.4 and self.may_wipe(name))

    def cut_some(self) -> None:
        a, b = sorted(self.rng.sample(NODES, 2))
        self.log(f"cut {a}-{b}")
        self.cut.add((a, b))

    def heal_some(self) -> None:
        if self.cut:
            a, b = self.rng.choice(sorted(self.cut))
            self.log(f"heal {a}-{b}")
            self.cut.discard((a, b))

    # -- start, heal, settle -----------------------------------------------------------
    def start(self) -> None:
        """Every node's follower runs; each store starts alone on a node, as a new runtime
        places it, and its leader seeds its copies."""
        for node in self.nodes.values():
            node.follower = Follower(node, self.clock.monotonic())
        starter = Proc("runtime", NODES[0])
        for store in self.stores:
            name = self.rng.choice(NODES)
            self.claim(ControlPlace(store, (name,)), starter)
            self.launch(store, name, self.nodes[name].boot)

    def heal(self) -> None:
        """The faults stop: nodes resume and restart with their disks, links heal, late
        calls run. Quiet rounds follow until every store settles; the stores no control
        actor runs for then are started as ``rayq.start()`` does, and all must settle."""
        self.faults = CALM
        self.log("heal")
        for name, node in self.nodes.items():
            if node.state is NodeState.PAUSED:
                self.resume(name)
            elif node.state is NodeState.DOWN:
                self.restart(name)
        self.cut.clear()
        while self.deliver():
            pass
        if self.settle():
            return
        self.start_runtime()
        if not self.settle():
            self.fail("the stores never settled after the faults healed: " + ", ".join(
                f"{s}: {self.unsettled(s) or ('settled' if ok else 'its write failed')}"
                for s, ok in zip(self.stores, self.acked_last)))

    def settle(self) -> bool:
        """Rounds of every watcher, every leader's keep and a write to each store, until
        a round where each store is settled and acknowledged its write."""
        for _ in range(HEAL_ROUNDS):
            self.clock.advance(1.0)
            for name in NODES:
                self.watch(name)
            for leader in list(self.leaders):
                self.keep(leader)
            self.acked_last = [self.write(store) for store in self.stores]
            self.oracle.after_step()
            if all(self.acked_last) and not any(self.unsettled(s) for s in self.stores):
                self.oracle.settled()
                return True
        return False

    def unsettled(self, store: str) -> str:
        """Why ``store`` is not settled yet ("" when it is)."""
        leader, place = self.actors.get(store), self.gcs.place(store)
        if leader is None or not leader.proc.alive:
            return "no control actor runs"
        if leader.rep.refused is not None:
            return f"{leader.proc.name} refuses writes ({leader.rep.refused})"
        if leader.rep.place != place:
            return f"{leader.proc.name} holds epoch {leader.rep.place.epoch} of {place.epoch}"
        if len(place.in_sync) < self.copies:
            return f"{len(place.in_sync)} copies in sync"
        return ""

    def start_runtime(self) -> None:
        """``rayq.start()`` for the stores no control actor runs for: a follower on every
        node, each place cut to the in-sync copies on disk that applied the most (or
        rebuilt from the disks), and a control actor on its leader."""
        self.outcome.runtime_started = True
        self.log("runtime start")
        for node in self.nodes.values():
            if node.follower is None:
                node.follower = Follower(node, self.clock.monotonic())
        stores = [s for s in self.stores if s not in self.actors]
        on_disk = {name: {store: replica_of(kv) for store, kv in node.disk.items()}
                   for name, node in self.nodes.items()}
        starter = Proc("runtime", NODES[0])
        places = starting_places({s: self.gcs.place(s) for s in stores}, on_disk, list(NODES),
                                 lambda p: self.claim(p, starter), self.gcs.place)
        for store, place in places.items():
            self.launch(store, place.leader, self.nodes[place.leader].boot)


class TraceLog(logging.Handler):
    """What the code under test logs goes into the trace, in its place among the steps."""

    def __init__(self, world: World):
        super().__init__(logging.INFO)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        self.world.log(f"| {record.getMessage()}"[:200])


def simulate(seed: int, *, stores: tuple[str, ...] = ("manager",), steps: int = 60,
             weather: Faults | None = None) -> Outcome:
    """Run one seed: start, ``steps`` scheduled steps under its weather (drawn from the
    seed unless given), heal, settle. Raises SimulationFailure with the trace when an
    invariant breaks."""
    world = World(seed, stores=stores, steps=steps, weather=weather)
    logger, handler = logging.getLogger("rayq.control"), TraceLog(world)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        world.start()
        for _ in range(steps):
            world.step()
        world.heal()
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        world.close()
    return world.outcome


def failures(seeds: range, *, stores: tuple[str, ...], steps: int,
             weather: Faults | None = None, limit: int = 5) -> list[SimulationFailure]:
    """The failures of ``seeds``, the first ``limit`` of them."""
    found = []
    for seed in seeds:
        try:
            simulate(seed, stores=stores, steps=steps, weather=weather)
        except SimulationFailure as failure:
            found.append(failure)
            if len(found) == limit:
                break
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay one seed (its whole trace) or "
                                     "run a range of seeds of the control-store simulation.")
    parser.add_argument("seed", type=int, nargs="?", help="the seed to replay")
    parser.add_argument("--seeds", help="FIRST:END, a range of seeds to run")
    parser.add_argument("--stores", default="manager",
                        help=f"comma-separated, of {','.join(CONTROL_STORES)}")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--weather", type=Faults.parse, help="every seed under this "
                        "weather, e.g. " + Faults.spec(CALM) + " (default: drawn per seed)")
    args = parser.parse_args(argv)
    stores, weather = tuple(args.stores.split(",")), args.weather
    if args.seeds:
        first, end = (int(x) for x in args.seeds.split(":"))
        found = failures(range(first, end), stores=stores, steps=args.steps, weather=weather,
                         limit=end - first)
        for failure in found:
            print(str(failure).split("\n", 1)[0])
        print(f"{len(found)} of {end - first} seeds failed")
        return 1 if found else 0
    try:
        outcome = simulate(args.seed, stores=stores, steps=args.steps, weather=weather)
    except SimulationFailure as failure:
        print("\n".join(failure.outcome.trace))
        print(str(failure).split("\n", 1)[0])
        return 1
    print("\n".join(outcome.trace))
    print(f"seed {args.seed}: {outcome.acked} writes acknowledged, {outcome.claims} claims, "
          f"{outcome.failovers} failovers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
