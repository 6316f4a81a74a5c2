"""Replicas of a shard: epochs, the in-sync set and failover, as functions of tables
(docs/replication.md).

The manager alone changes a shard's :class:`ShardPlace`, each change under a new
epoch; replicas refuse what comes under an epoch older than the one they hold, so a
leader that was replaced cannot acknowledge anything. A follower applies the
leader's write sets in their order, each numbered by a sequence number.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from rayq.core.control.placement import ShardPlace
from rayq.errors import NotEnoughReplicas, ReplicaBehind, StaleEpoch


def check_epoch(held: int, offered: int, what: str = "write") -> None:
    """Raise StaleEpoch when ``offered`` is older than the ``held`` epoch."""
    if offered < held:
        raise StaleEpoch(f"{what} under epoch {offered} refused: this replica holds epoch {held}")


def fresh_count(applied_seq: int, first_seq: int, count: int) -> int:
    """How many of ``count`` write sets numbered from ``first_seq`` a follower that
    applied through ``applied_seq`` still lacks (the rest came before: a resend).
    Raises ReplicaBehind when they start past a gap: the follower missed some."""
    if first_seq > applied_seq + 1:
        raise ReplicaBehind(f"write sets from {first_seq} offered to a replica at {applied_seq}")
    return max(0, first_seq + count - 1 - applied_seq)


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
    """``place`` without the out-of-sync replica on ``node`` (its node is gone)."""
    if node == place.leader or node in place.in_sync:
        return place
    return ShardPlace(place.shard, tuple(n for n in place.replicas if n != node),
                      place.in_sync, place.epoch + 1)


def promote(place: ShardPlace, alive: Collection[str]) -> ShardPlace | None:
    """The place after the leader's loss: the first alive in-sync follower leads under
    the next epoch, the other alive in-sync followers stay in sync. The old leader is
    no replica any more (it may hold writes nobody acknowledged). None when no in-sync
    follower is alive: the shard waits for its leader."""
    chosen = next((n for n in place.in_sync[1:] if n in alive), None)
    if chosen is None:
        return None
    others = tuple(n for n in place.replicas if n not in (place.leader, chosen) and n in alive)
    in_sync = (chosen,) + tuple(n for n in place.in_sync if n in others)
    return ShardPlace(place.shard, (chosen,) + others, in_sync, place.epoch + 1)


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
