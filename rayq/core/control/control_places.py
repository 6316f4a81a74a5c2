"""Where the control stores live: their copies, epochs and failover, as functions of
tables (docs/replication.md, "The control plane").

The manager's, the fairness coordinator's and the flood detector's stores are kept
as shards are: a leader (the control actor itself) and in-sync copies on other data
nodes, each write set applied by every in-sync copy before the call that wrote it
returns. A store's :class:`ControlPlace` changes only under a new epoch, and each
epoch is claimed once, first come first served, in Ray's GCS (its key is written only
if absent): two watchers that both see a leader lost cannot both promote a copy, and
a deposed leader cannot change its place. A copy refuses write sets of an epoch older
than the one it holds, so a leader that was replaced cannot change any copy either.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from rayq.core.replication.shard_places import best_copies

# The control stores, by the folder each keeps in its node's folder: the runtime's own,
# and the SQS endpoint's (placed while the endpoint is served).
CONTROL_STORES = ("manager", "coordinator", "flood")
SQS_STORE = "sqs"
ALL_STORES = CONTROL_STORES + (SQS_STORE,)
CLAIM_PREFIX = "rayq/control/"
EPOCH_DIGITS = 12  # claim keys sort by epoch as bytes


@dataclass(frozen=True)
class ControlPlace:
    """Where control store ``store`` lives under ``epoch``: the nodes of its in-sync
    copies, the leader's first (the node its control actor runs on)."""

    store: str
    in_sync: tuple[str, ...]
    epoch: int = 1

    @property
    def leader(self) -> str:
        return self.in_sync[0]

    @property
    def followers(self) -> tuple[str, ...]:
        return self.in_sync[1:]


def claim_prefix(store: str) -> bytes:
    return f"{CLAIM_PREFIX}{store}/".encode()


def claim_key(place: ControlPlace) -> bytes:
    """The GCS key that holds ``place``: one per store and epoch, written once."""
    return claim_prefix(place.store) + str(place.epoch).zfill(EPOCH_DIGITS).encode()


def newest_key(keys: Sequence[bytes]) -> bytes | None:
    """The key of the highest epoch among a store's claim keys (None: none claimed)."""
    return max(keys, default=None)


def given_up(before: ControlPlace | None, after: ControlPlace | None) -> str | None:
    """The node whose leader a failover gave up on from ``before`` to ``after`` (the
    store's two newest places): the old leader, now out of the in-sync copies. What
    else ran there is suspect too (None: no such node)."""
    if before is None or after is None or before.leader in after.in_sync:
        return None
    return before.leader


def encode_place(place: ControlPlace) -> bytes:
    return json.dumps({"store": place.store, "in_sync": list(place.in_sync),
                       "epoch": place.epoch}).encode()


def decode_place(raw: bytes | None) -> ControlPlace | None:
    if not raw:
        return None
    data = json.loads(raw)
    return ControlPlace(data["store"], tuple(data["in_sync"]), int(data["epoch"]))


def without(place: ControlPlace, node: str) -> ControlPlace:
    """``place`` without the copy on ``node`` (lost or behind), under the next epoch.
    The leader's own copy never leaves this way: only failover replaces it."""
    if node not in place.followers:
        return place
    return ControlPlace(place.store, tuple(n for n in place.in_sync if n != node),
                        place.epoch + 1)


def joined(place: ControlPlace, node: str) -> ControlPlace:
    """``place`` with a copy on ``node`` that holds every write set, next epoch."""
    if node in place.in_sync:
        return place
    return ControlPlace(place.store, place.in_sync + (node,), place.epoch + 1)


def promoted(place: ControlPlace, applied: Mapping[str, int],
             prefer: str | None = None) -> ControlPlace | None:
    """The place after the leader's loss. ``applied``: the last sequence number each
    reachable in-sync copy applied, read as it was fenced with the next epoch. The
    copy that applied most leads (``prefer`` among equals, else the first in the
    place); the others that applied as much stay in sync, the rest leave (seeded again
    later). A copy outside ``place.followers`` is never chosen, however much it holds:
    a node back with an empty folder, or one taken out of sync, is no candidate. Nor is
    a copy that applied nothing: every copy joins having applied a write set (the
    leader writes one before it seeds a first copy), so an in-sync copy at 0 is a
    folder that came back empty before its leader noticed, and promoting it would
    lose every write the others hold. None when no in-sync copy that applied anything
    is reachable: the store waits for one."""
    candidates = [n for n in place.followers if applied.get(n, 0) > 0]
    if not candidates:
        return None
    chosen = max(candidates, key=lambda n: (applied[n], n == prefer, -candidates.index(n)))
    rest = tuple(n for n in candidates if n != chosen and applied[n] == applied[chosen])
    return ControlPlace(place.store, (chosen,) + rest, place.epoch + 1)


def recovered(store: str, held: Mapping[str, tuple[int, int]], alive: Sequence[str]
              ) -> ControlPlace | None:
    """A store's place rebuilt from the copies on the alive nodes' disks, when Ray's
    GCS holds none (the whole cluster restarted). ``held``: (epoch, last sequence
    number applied) of each node's copy. The copies of the highest (epoch, sequence)
    are in sync and the first of them by name leads, under the next epoch: a node with
    an empty folder never leads while a fuller copy exists. None when no alive node
    holds a copy (a new runtime)."""
    copies = {n: held[n] for n in sorted(alive) if n in held and held[n] != (0, 0)}
    if not copies:
        return None
    best = max(copies.values())
    in_sync = tuple(n for n, state in copies.items() if state == best)
    return ControlPlace(store, in_sync, best[0] + 1)


def seed_target(place: ControlPlace, alive: Sequence[str], copies: int,
                copies_per_node: Mapping[str, int], draining: Collection[str] = (),
                failed: Mapping[str, int] | None = None) -> str | None:
    """The alive node to seed a new copy of ``place`` on while it has fewer than
    ``copies`` in sync on nodes that are not ``draining`` (capped by the nodes that
    stay): one that stays and holds none, the fewest failed seedings first (``failed``:
    per node, the seedings there that failed in a row, so one node alive but out of
    reach does not keep the store short of copies while others are free), then the
    fewest control copies. None when none is wanted or free."""
    staying = [n for n in sorted(alive) if n not in draining]
    if len([n for n in place.in_sync if n not in draining]) >= min(copies, len(staying)):
        return None
    free = [n for n in staying if n not in place.in_sync]
    failed = failed or {}
    return min(free, key=lambda n: (failed.get(n, 0), copies_per_node.get(n, 0), n)) \
        if free else None


def hands_over(place: ControlPlace, draining: Collection[str], staying: Collection[str],
               copies: int) -> bool:
    """Whether ``place``'s leader, on a draining node, is to hand its store over now:
    once it has ``copies`` in sync on nodes that stay (capped by their number), so the
    store keeps as many copies after the move."""
    kept = [n for n in place.followers if n in staying]
    return place.leader in draining and len(kept) >= min(copies, len(staying))


def leaving_copies(place: ControlPlace, alive: Sequence[str], copies: int,
                   draining: Collection[str]) -> list[str]:
    """The in-sync followers of ``place`` that leave now: those whose node is gone, and
    those on a draining node once enough copies are in sync on nodes that stay."""
    staying = [n for n in alive if n not in draining]
    kept = [n for n in place.in_sync if n not in draining]
    enough = len(kept) >= min(copies, len(staying))
    return [n for n in place.followers if n not in alive or (enough and n in draining)]


def trusted(place: ControlPlace, held: Mapping[str, tuple[int, int] | None]) -> ControlPlace:
    """``place`` as a starting runtime may follow it: its in-sync set cut to
    :func:`best_copies`, under the next epoch if that changed it."""
    best = best_copies(place.in_sync, held)
    return place if best == place.in_sync else ControlPlace(place.store, best, place.epoch + 1)


def starting_place(store: str, found: ControlPlace | None,
                   held: Mapping[str, tuple[int, int]], alive: Sequence[str]) -> ControlPlace:
    """``store``'s place as a starting runtime takes it: the one claimed (``found``) cut
    to its trusted copies (:func:`trusted`), else rebuilt from the copies on the alive
    nodes' disks (:func:`recovered`), else a new one on the first alive node by name."""
    if found is not None:
        return trusted(found, held)
    return recovered(store, held, alive) or ControlPlace(store, (sorted(alive)[0],))


def starting_places(found: Mapping[str, ControlPlace | None],
                    on_disk: Mapping[str, Mapping[str, tuple[int, int]]], alive: Sequence[str],
                    claim: Callable[[ControlPlace], bool],
                    current: Callable[[str], ControlPlace]) -> dict[str, ControlPlace]:
    """Every control store's :func:`starting_place` (``found``: as claimed now;
    ``on_disk``: per node, per folder, the copies its disk holds), each claimed when it
    changed; where another starter claimed that epoch first, its place (``current``)."""
    places = {}
    for store, claimed in found.items():
        held = {node: copies[store] for node, copies in on_disk.items() if store in copies}
        place = starting_place(store, claimed, held, alive)
        places[store] = place if place == claimed or claim(place) else current(store)
    return places


def copy_folders(names: Sequence[str]) -> list[str]:
    """The entries of a node's folder that are store copies: shards' and control stores'."""
    return [n for n in names if n in ALL_STORES or
            (n.startswith("shard-") and n[6:].isdigit())]


def control_left_on(places: Mapping[str, ControlPlace], node: str) -> dict[str, int]:
    """What ``node`` still holds of the control stores: how many it leads, how many copies."""
    return {"leads": sum(p.leader == node for p in places.values()),
            "copies": sum(node in p.in_sync for p in places.values())}


def drained(left: Mapping[str, Mapping[str, int]]) -> bool:
    """Whether a drain's ``left`` (what the node holds, by kind) is all zeros."""
    return not any(n for counts in left.values() for n in counts.values())
