"""Replicas of a shard: epochs, the in-sync set and failover, as functions of tables
(docs/replication.md).

The manager alone changes a shard's :class:`ShardPlace`, each change under a new
epoch; replicas refuse what comes under an epoch older than the one they hold, so a
leader that was replaced cannot acknowledge anything. A follower applies the
leader's write sets in their order, each numbered by a sequence number.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rayq.core.kit.kv import WriteSet, write_bytes
from rayq.core.replication.replica import check_epoch
from rayq.errors import NotEnoughReplicas

log = logging.getLogger("rayq.replicas")

def acked_through(acked: Mapping[str, int], followers: Collection[str], committed: int) -> int:
    """The highest sequence number every follower in ``followers`` applied (the
    leader's own ``committed`` when it has none): writes up to it may be acknowledged."""
    return min((acked.get(n, 0) for n in followers), default=committed)


def check_in_sync(place: ShardPlace, min_in_sync: int) -> None:
    """Raise NotEnoughReplicas when ``place`` has fewer than ``min_in_sync`` in-sync copies."""
    if len(place.in_sync) < min_in_sync:
        raise NotEnoughReplicas(f"shard {place.shard} has {len(place.in_sync)} in-sync "
                                f"copies, fewer than min_in_sync={min_in_sync}")


def shrink(place: ShardPlace, node: str, epoch: int) -> ShardPlace:
    """``place`` without ``node`` in its in-sync set, under the next epoch (Kafka's ISR
    shrink), as the leader of ``epoch`` asks. Raises StaleEpoch when that leader was
    replaced. The node stays a replica (out of sync) until a new follower is seeded."""
    check_epoch(place.epoch, epoch, "in-sync change")
    if node not in place.in_sync or node == place.leader:
        return place
    return ShardPlace(place.shard, place.replicas,
                      tuple(n for n in place.in_sync if n != node), place.epoch + 1)


def rejoin(place: ShardPlace, node: str) -> ShardPlace:
    """``place`` with ``node`` (a follower that caught up) in sync again, next epoch."""
    replicas = place.replicas if node in place.replicas else place.replicas + (node,)
    in_sync = place.in_sync if node in place.in_sync else place.in_sync + (node,)
    return ShardPlace(place.shard, replicas, in_sync, place.epoch + 1)


def drop_replica(place: ShardPlace, node: str) -> ShardPlace:
    """``place`` without the out-of-sync replica on ``node`` (its node is gone). The
    in-sync set stays as it is, and so does the epoch."""
    if node == place.leader or node in place.in_sync:
        return place
    return ShardPlace(place.shard, tuple(n for n in place.replicas if n != node),
                      place.in_sync, place.epoch)


def seed_target(place: ShardPlace, alive: Sequence[str], copies: int,
                followers_per_node: Mapping[str, int]) -> str | None:
    """The node to seed a new follower of ``place`` on while it has fewer than
    ``copies`` in-sync copies: an alive node holding no in-sync copy, the fewest
    followers first (:func:`new_follower_node`). None when none is wanted or free."""
    if len(place.in_sync) >= copies:
        return None
    synced = ShardPlace(place.shard, place.in_sync, place.in_sync, place.epoch)
    return new_follower_node(synced, alive, followers_per_node)


def followers_per_node(places: Iterable[ShardPlace]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for place in places:
        for node in place.followers:
            counts[node] = counts.get(node, 0) + 1
    return counts


def promote(place: ShardPlace, applied: Mapping[str, int],
            prefer: str | None = None) -> ShardPlace | None:
    """The place after the leader's loss (or its planned move to ``prefer``).
    ``applied``: the last sequence number each reachable follower applied, read as the
    manager fenced it. The in-sync follower that applied most leads under the next
    epoch (``prefer`` if it applied as much, else the first such); the others that
    applied as much stay in sync, any other reachable one stays a replica out of
    sync. The old leader is no replica any more (it may hold writes nobody
    acknowledged). None when no in-sync follower is reachable: the shard waits."""
    candidates = [n for n in place.in_sync[1:] if n in applied]
    if not candidates:
        return None
    chosen = max(candidates, key=lambda n: (applied[n], n == prefer, -candidates.index(n)))
    others = tuple(n for n in place.replicas if n not in (place.leader, chosen) and n in applied)
    in_sync = (chosen,) + tuple(n for n in candidates
                                if n != chosen and applied[n] == applied[chosen])
    return ShardPlace(place.shard, (chosen,) + others, in_sync, place.epoch + 1)


async def fence_reachable(followers: Sequence[str], alive: Collection[str],
                          fence: Callable[[str], Awaitable[int | None]]) -> dict[str, int]:
    """The last sequence number each of ``followers`` on an ``alive`` node applied, read
    as ``fence(node)`` made it hold the next epoch (a failover's first step, for shards
    and control stores alike); the unreachable ones (None) are left out."""
    reachable = [n for n in followers if n in alive]
    seqs = await asyncio.gather(*(fence(n) for n in reachable))
    return {n: s for n, s in zip(reachable, seqs) if s is not None}


class FailoverPeers(Protocol):
    """What the manager asks of the cluster to replace a shard's leader."""

    async def fence(self, shard: int, node: str, epoch: int) -> int | None:
        """Have the follower on ``node`` hold ``epoch`` durably; the last sequence number
        it applied, None when it cannot be reached."""

    async def replace(self, old: ShardPlace, new: ShardPlace) -> None:
        """Stop ``old``'s leader, record and publish ``new``, start its leader."""


async def fail_over(place: ShardPlace, alive: Collection[str], peers: FailoverPeers,
                    prefer: str | None = None) -> ShardPlace | None:
    """Replace ``place``'s leader: fence its reachable in-sync followers on ``alive``
    nodes with the next epoch (from then on they refuse the old leader's write sets),
    promote the one that applied most (:func:`promote`, ``prefer`` if it applied as
    much), then have ``peers`` replace the leader. The new place, or None when no
    in-sync follower is reachable (the shard waits for its leader)."""
    applied = await fence_reachable(place.in_sync[1:], alive,
                                    lambda n: peers.fence(place.shard, n, place.epoch + 1))
    new = promote(place, applied, prefer)
    if new is None:
        log.error("shard %d: leader on %s lost and no in-sync follower reachable",
                  place.shard, place.leader)
        return None
    log.warning("shard %d: leader on %s replaced; %s leads under epoch %d", place.shard,
                place.leader, new.leader, new.epoch)
    await peers.replace(place, new)
    return new


def leader_move(places: Mapping[int, ShardPlace], alive: Sequence[str],
                busy: bool) -> tuple[int, str] | None:
    """One planned leadership move that evens out the leaders over the alive data nodes
    (a node that joined leads nothing yet), as Kafka's preferred-leader election: a
    shard led by the node leading most moves to an in-sync follower on the node
    leading fewest, when they differ by two or more. Only while every shard is in
    sync and nothing is being seeded (``busy``), one move at a time. None: balanced."""
    if busy or not alive or any(p.under_replicated for p in places.values()):
        return None
    led = {n: 0 for n in alive}
    for place in places.values():
        if place.leader in led:
            led[place.leader] += 1
    fewest = min(alive, key=lambda n: (led[n], n))
    most = max(alive, key=lambda n: (led[n], n))
    if led[most] - led[fewest] < 2:
        return None
    return next(((p.shard, fewest) for _, p in sorted(places.items())
                 if p.leader == most and fewest in p.in_sync[1:]), None)


def leader_lost(place: ShardPlace, alive: Collection[str], failed_pings: int,
                max_failed_pings: int) -> bool:
    """Whether ``place``'s leader counts as lost: its node is gone, or it missed
    ``max_failed_pings`` pings in a row (paused, partitioned)."""
    return place.leader not in alive or failed_pings >= max_failed_pings


def role_of(place: ShardPlace | None, node: str) -> str:
    """How ``node`` serves a shard, for statistics: leader (under-replicated when
    some copy is out of sync), follower, or out-of-sync."""
    if place is None or node == place.leader:
        return "leader (under-replicated)" if place is not None and place.under_replicated \
            else "leader"
    return "follower" if node in place.in_sync else "out-of-sync"


def encode_places(places: Mapping[int, ShardPlace]) -> bytes:
    return json.dumps({str(p.shard): [list(p.replicas), list(p.in_sync), p.epoch]
                       for p in places.values()}, sort_keys=True).encode()


def decode_places(raw: bytes | None) -> dict[int, ShardPlace]:
    """Places as :func:`encode_places` wrote them ({} for None)."""
    if not raw:
        return {}
    return {int(shard): ShardPlace(int(shard), tuple(replicas), tuple(in_sync), int(epoch))
            for shard, (replicas, in_sync, epoch) in json.loads(raw).items()}


def with_followers(leaders: Mapping[int, str], nodes: Sequence[str], replicas: int
                   ) -> dict[int, ShardPlace]:
    """Each shard's place: its leader's node (``leaders``) and the next ``replicas``-1
    nodes round the ring of ``nodes`` sorted by name (capped by their number: two
    copies on one disk protect nothing), all in sync under epoch 1."""
    names = sorted(nodes)
    copies = max(1, min(replicas, len(names)))
    places = {}
    for shard, leader in leaders.items():
        at = names.index(leader) if leader in names else 0
        chosen = (leader,) + tuple(n for n in (names[(at + k) % len(names)]
                                               for k in range(1, copies)) if n != leader)
        places[shard] = ShardPlace(shard, chosen, chosen)
    return places


class ShipLog:
    """The leader's side: its write sets, one per group commit, numbered by sequence,
    kept until every in-sync follower applied them; and the acknowledgements that
    wait for them (tokens, released in sequence order)."""

    def __init__(self, committed: int, followers: Iterable[str]):
        self.committed = committed  # the last sequence number committed on the leader
        self._log: deque[WriteSet] = deque()  # sequence numbers first_seq, first_seq+1, ...
        self._first = committed + 1
        self.acked = {n: committed for n in followers}
        self.joining: dict[str, int] = {}  # followers catching up: not waited for yet
        self._sent = dict(self.acked)
        self._waiting: deque[tuple[int, object]] = deque()

    @property
    def followers(self) -> tuple[str, ...]:
        return tuple(self.acked)

    def add(self, writes: WriteSet) -> int:
        """Keep the write set of the next group commit; its sequence number."""
        self._log.append(writes)
        self.committed += 1
        return self.committed

    def wait(self, seq: int, token: object) -> None:
        """Hold ``token`` until every in-sync follower applied ``seq`` (see :meth:`released`)."""
        self._waiting.append((seq, token))

    def batch(self, node: str, max_sets: int,
              max_bytes: int | None = None) -> tuple[int, list[WriteSet]]:
        """(first sequence number, write sets) ``node`` is sent next (none: empty): at
        most ``max_sets``, and no more once they hold ``max_bytes`` of values (one set
        always goes, however large: a task's body may be hundreds of MiB)."""
        first = self._sent[node] + 1
        start = first - self._first
        sets = [self._log[i] for i in range(start, min(len(self._log), start + max_sets))]
        if max_bytes is not None:
            sets = sets[:sets_within(sets, max_bytes)]
        self._sent[node] += len(sets)
        return first, sets

    def applied(self, node: str, seq: int) -> None:
        for table in (self.acked, self.joining):
            if node in table:
                table[node] = max(table[node], seq)
        self._trim()

    def resend(self, node: str) -> None:
        """Send ``node`` again what it did not confirm (a call that failed)."""
        if node in self.acked:
            self._sent[node] = self.acked[node]

    def remove(self, node: str) -> None:
        """``node`` is out of sync: nothing waits for it any more."""
        self.acked.pop(node, None)
        self.joining.pop(node, None)
        self._sent.pop(node, None)
        self._trim()

    def join(self, node: str) -> None:
        """A follower is being seeded: keep every write set from now on for it (its
        copy is taken after this; :meth:`copied` says from which one it starts)."""
        self.joining[node] = self._sent[node] = self.committed

    def copied(self, node: str, seq: int) -> None:
        """``node``'s copy holds every write set through ``seq``: it catches up after."""
        self.joining[node] = self._sent[node] = seq

    def follows(self, node: str) -> bool:
        return node in self.acked or node in self.joining

    def caught_up(self, node: str, lag: int = 0) -> bool:
        """Whether a joining follower applied every write set committed so far but at
        most ``lag`` (while writes go on, one always lands during the call that applied
        the rest)."""
        return node in self.joining and self.joining[node] >= self.committed - lag

    def count(self, node: str) -> None:
        """A joining follower is in sync from now on: acknowledgements wait for it."""
        if node in self.joining:
            self.acked[node] = self.joining.pop(node)

    def released(self) -> list[object]:
        """The tokens whose write sets every in-sync follower applied, in order."""
        through = acked_through(self.acked, self.acked, self.committed)
        out = []
        while self._waiting and self._waiting[0][0] <= through:
            out.append(self._waiting.popleft()[1])
        return out

    def all_waiting(self) -> list[object]:
        """Every token still held (to fail them), and none held from now on."""
        tokens = [token for _, token in self._waiting]
        self._waiting.clear()
        return tokens

    def _trim(self) -> None:
        kept = {**self.acked, **self.joining}
        through = acked_through(kept, kept, self.committed)
        while self._log and self._first <= through:
            self._log.popleft()
            self._first += 1


def newest(*tables: Mapping[int, ShardPlace]) -> dict[int, ShardPlace]:
    """Per shard, the place of the highest epoch among ``tables`` (the first on ties)."""
    out: dict[int, ShardPlace] = {}
    for table in tables:
        for shard, place in table.items():
            if shard not in out or place.epoch > out[shard].epoch:
                out[shard] = place
    return out


def seeds_wanted(places: Mapping[int, ShardPlace], alive: Sequence[str], copies: int,
                 busy: Collection[int]) -> list[tuple[int, str]]:
    """(shard, node) for each under-replicated shard to seed a follower of now: its
    leader alive, no seeding of it under way (``busy``), a node free for a copy
    (:func:`seed_target`), the followers spread as they are added."""
    counts = followers_per_node(places.values())
    wanted = []
    for place in places.values():
        node = (seed_target(place, alive, copies, counts)
                if place.shard not in busy and place.leader in alive else None)
        if node is not None:
            wanted.append((place.shard, node))
            counts[node] = counts.get(node, 0) + 1
    return wanted


def watched(places: Iterable[ShardPlace]) -> list[ShardPlace]:
    """The places whose leader is watched: those with an in-sync follower to promote."""
    return [p for p in places if len(p.in_sync) > 1]


def pings_counted(answered: Mapping[int, bool], starting: Mapping[int, float],
                  now: float) -> tuple[dict[int, bool], dict[int, float]]:
    """(each shard's ping as counted, the leaders still starting): a leader the manager
    started, until its first answer or the end of its grace (``starting``: shard ->
    until when), misses no ping: a new worker process and its store take a while."""
    still = {shard: until for shard, until in starting.items()
             if not answered.get(shard, False) and until > now}
    return {shard: ok or shard in still for shard, ok in answered.items()}, still


def missing(missed: Mapping[Any, int], max_failed_pings: int) -> bool:
    """Whether a leader missed its last ping without counting as lost yet (``missed``:
    pings missed in a row, by shard or store): the next check should come soon."""
    return any(0 < n < max_failed_pings for n in missed.values())


def count_missed(missed: Mapping[int, int], answered: Mapping[int, bool]) -> dict[int, int]:
    """Pings missed in a row per shard, after a round that ``answered`` or not."""
    return {shard: 0 if ok else missed.get(shard, 0) + 1 for shard, ok in answered.items()}


def lost_leaders(places: Iterable[ShardPlace], alive: Collection[str], missed: Mapping[int, int],
                 max_failed_pings: int) -> list[int]:
    """The shards whose leader is lost (:func:`leader_lost`)."""
    return [p.shard for p in places
            if leader_lost(p, alive, missed.get(p.shard, 0), max_failed_pings)]


def one_copy(place: ShardPlace | None, replicas: int | None) -> bool:
    """Whether a shard keeps one copy, recording and shipping nothing: never placed, on
    the embedded runtime's unnamed node, or ``replicas=1``."""
    return place is None or place.leader == LOCAL_NODE or replicas == 1


def trusted_shard(place: ShardPlace, held: Mapping[str, tuple[int, int] | None]) -> ShardPlace:
    """``place`` as a starting runtime may follow it: only the in-sync copies that
    applied the most (:func:`~rayq.core.control.control_places.best_copies`) stay in
    sync, the first of them leads, the others stay replicas out of sync (to be seeded
    again), under the next epoch if anything changed."""
    best = best_copies(place.in_sync, held)
    if best == place.in_sync:
        return place
    return ShardPlace(place.shard, best + tuple(n for n in place.replicas if n not in best),
                      best, place.epoch + 1)


def recovered_shards(held: Mapping[str, Mapping[str, tuple[int, int]]], shards: int
                     ) -> dict[int, ShardPlace]:
    """Places rebuilt from the copies on the data nodes' disks, when Ray's GCS holds none
    (the whole cluster restarted). ``held``: per node, per folder name (``shard-<i>``),
    the (epoch, last sequence number) its copy holds. For each shard some node holds a
    replicated copy of, the copies of the highest (epoch, sequence) are in sync and
    the first by name leads, under the next epoch (above any a copy holds, so every
    copy takes it); the other copies stay replicas out of sync, to be seeded again. A
    shard with no such copy (new, or keeping one copy) is left out."""
    places = {}
    for shard in range(shards):
        copies = {node: found[f"shard-{shard}"] for node, found in sorted(held.items())
                  if found.get(f"shard-{shard}", (0, 0)) != (0, 0)}
        if copies:
            best = max(copies.values())
            in_sync = tuple(n for n, state in copies.items() if state == best)
            behind = tuple(n for n in copies if n not in in_sync)
            places[shard] = ShardPlace(shard, in_sync + behind, in_sync, best[0] + 1)
    return places


def reusable(places: Mapping[int, ShardPlace], shards: int, alive: Collection[str]) -> bool:
    """Whether published places still fit: every shard placed, every in-sync copy on
    an alive data node."""
    return len(places) == shards and all(n in alive for p in places.values() for n in p.in_sync)


def draining_copies(place: ShardPlace, draining: Collection[str]) -> list[str]:
    """The nodes of ``draining`` that hold a copy of ``place`` (its leader's included)."""
    return [n for n in place.replicas if n in draining]


def drain_seeds(places: Mapping[int, ShardPlace], draining: Collection[str],
                alive: Sequence[str], copies: int, busy: Collection[int]) -> list[tuple[int, str]]:
    """(shard, node) for each shard with a copy on a draining node to seed a follower of
    now, so it keeps ``copies`` in sync without the draining nodes before one of those
    leaves it: on an alive node that does not drain and holds no copy of it yet, the
    fewest followers first. ``copies`` is capped by the nodes that stay."""
    staying = [n for n in sorted(alive) if n not in draining]
    copies = min(copies, len(staying))
    counts = followers_per_node(places.values())
    wanted = []
    for place in places.values():
        kept = [n for n in place.in_sync if n not in draining]
        if (place.shard in busy or place.leader not in alive or len(kept) >= copies
                or not draining_copies(place, draining)):
            continue
        free = [n for n in staying if n not in place.replicas]
        if free:
            node = min(free, key=lambda n: (counts.get(n, 0), n))
            wanted.append((place.shard, node))
            counts[node] = counts.get(node, 0) + 1
    return wanted


def drain_step(places: Mapping[int, ShardPlace], draining: Collection[str],
               alive: Sequence[str], copies: int) -> tuple[str, int, str] | None:
    """The next move of a drain, one at a time, once the shard has ``copies`` in sync
    on nodes that stay (:func:`drain_seeds` gets it there):

    - ``("lead", shard, node)``: its leader drains; the leadership moves to the in-sync
      follower on ``node`` (a planned move: the follower holds every write set);
    - ``("drop", shard, node)``: the follower on the draining ``node`` leaves the shard.

    None when nothing is to move now (done, or waiting for a seeding)."""
    copies = min(copies, len([n for n in alive if n not in draining]))
    for _, place in sorted(places.items()):
        kept = [n for n in place.in_sync if n not in draining]
        if len(kept) < copies or not kept:
            continue
        if place.leader in draining:
            return "lead", place.shard, kept[0]
        for node in place.followers:
            if node in draining:
                return "drop", place.shard, node
    return None


def drop_follower(place: ShardPlace, node: str) -> ShardPlace:
    """``place`` without the follower on ``node`` at all (it drains), under the same
    epoch: the leader learns of it when its next call to that follower fails and it
    asks for the follower's removal (answered with this place), so it is never told
    its epoch is stale. Failover trusts fewer copies meanwhile, never more."""
    return ShardPlace(place.shard, tuple(n for n in place.replicas if n != node),
                      tuple(n for n in place.in_sync if n != node), place.epoch)


def left_on(places: Mapping[int, ShardPlace], node: str) -> dict[str, int]:
    """What a node still holds of the shards: how many it leads, how many copies."""
    return {"leads": sum(p.leader == node for p in places.values()),
            "copies": sum(node in p.replicas for p in places.values())}


def best_copies(in_sync: Sequence[str], held: Mapping[str, tuple[int, int] | None]
                ) -> tuple[str, ...]:
    """Of a store's in-sync copies (a shard's or a control store's), those a starting
    runtime may trust, in their order: the copies that applied the most write sets
    among those found on disk (``held``: (epoch, sequence) per node, None where a
    node's folder holds no copy). A node back with an empty or older folder under a
    known name is left out: it becomes a copy to seed, never the leader whose copy
    would overwrite a fuller one. All of ``in_sync`` when none is found on disk."""
    found = {n: held[n][1] for n in in_sync if held.get(n) is not None}
    if not found:
        return tuple(in_sync)
    most = max(found.values())
    return tuple(n for n in in_sync if found.get(n) == most)


LOCAL_NODE = ""  # the name of the embedded runtime's only data node


@dataclass(frozen=True)
class ShardPlace:
    """Where one shard lives: its replicas' nodes, the leader first, and the epoch
    under which the manager last changed them. ``in_sync`` are the replicas the
    leader waits for before it acknowledges a write (the leader among them)."""

    shard: int
    replicas: tuple[str, ...]
    in_sync: tuple[str, ...]
    epoch: int = 1

    @property
    def leader(self) -> str:
        return self.replicas[0]

    @property
    def followers(self) -> tuple[str, ...]:
        return self.replicas[1:]

    @property
    def under_replicated(self) -> bool:
        return len(self.in_sync) < len(self.replicas) or len(set(self.replicas)) < len(self.replicas)


def new_follower_node(place: ShardPlace, nodes: Sequence[str],
                      followers_per_node: Mapping[str, int]) -> str | None:
    """A data node to seed a new follower of ``place`` on: one holding no replica of
    it, the fewest followers first. None when every node already holds one."""
    free = [n for n in sorted(nodes) if n not in place.replicas]
    return min(free, key=lambda n: (followers_per_node.get(n, 0), n)) if free else None


def set_bytes(writes: WriteSet) -> int:
    """The bytes a write set puts when applied, a moved row counted whole (what
    applying it costs, near enough; it ships less)."""
    return sum(map(write_bytes, writes))


def sets_within(sets: list[WriteSet], max_bytes: int) -> int:
    """How many of ``sets``, from the first, hold at most ``max_bytes`` (at least one)."""
    total = 0
    for n, writes in enumerate(sets):
        total += set_bytes(writes)
        if total > max_bytes and n:
            return n
    return len(sets)
