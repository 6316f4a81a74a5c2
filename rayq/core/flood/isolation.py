"""Where the flood detector moves a flooder's messages (docs/flood-detection.md), as
functions of the queue layout: its dedicated subqueues, the moves that isolate it, which
puts each shard diverts to its spill store, and what a sweep has left to move. The detector
actor only asks the manager and the shards to carry these out."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from rayq.core.flood.detection import FloodChanges, Flooder
from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueInfo, SubqueueInfo

SPILLED = "S"  # the kind of a spill store's entry in a shard's tenant counts


def subqueue_layout(queues: Mapping[str, QueueInfo]) -> dict[int, tuple[str, bool]]:
    """subqueue id -> (queue ref, dedicated?), as :func:`rayq.core.flood.detection.build_view` takes it."""
    return {sq.id: (ref, bool(sq.dedicated)) for ref, q in queues.items() for sq in q.subqueues}


def dedicated_to(queue: QueueInfo | None, flooder: Flooder, *,
                 open_only: bool = True) -> list[SubqueueInfo]:
    """The flooder's dedicated subqueues in ``queue`` (None: deleted, none); with
    ``open_only`` only those still taking the sweeper's messages (not coalescing)."""
    return [sq for sq in (queue.subqueues if queue is not None else ())
            if sq.dedicated == (flooder.type, flooder.tenant)
            and (sq.state is SubqueueState.ALL or not open_only)]


def dedicated_by_shard(queue: QueueInfo, flooder: Flooder) -> dict[int, int]:
    """The flooder's open dedicated subqueue on each shard that has one, by shard."""
    return {sq.shard: sq.id for sq in dedicated_to(queue, flooder)}


def shards_lacking_dedicated(queue: QueueInfo, have: Collection[int]) -> list[int]:
    """Shards with a live subqueue of ``queue`` but no dedicated one in ``have``
    (a flooder's first run, or subqueues added by scaling since)."""
    return sorted({sq.shard for sq in queue.subqueues if not sq.dedicated} - set(have))


def isolation_moves(queue: QueueInfo, dedicated: Mapping[int, int]) -> list[tuple[int, int, int]]:
    """(shard, source, target): each live subqueue's messages of the flooder move to
    its dedicated twin on the same shard."""
    return [(shard, source.id, target) for shard, target in dedicated.items()
            for source in queue.subqueues if source.shard == shard and not source.dedicated]


def serving_order(subqueues: Sequence[int], dedicated: Collection[int], turn: int,
                  every: int) -> list[int]:
    """The order one receive on a shard tries ``subqueues`` (given in receive order, the
    flooders' dedicated subqueues last): on every ``every``-th ``turn`` the dedicated
    ones go first, so an isolated flooder is slowed, never starved. ``every`` < 1
    never moves them."""
    if every < 1 or turn % every != every - 1:
        return list(subqueues)
    first = [sq for sq in subqueues if sq in dedicated]
    return first + [sq for sq in subqueues if sq not in dedicated]


def dedicated_on(queues: Mapping[str, QueueInfo], shards: int) -> list[list[int]]:
    """Per shard: the flooders' dedicated subqueues it holds."""
    out: list[list[int]] = [[] for _ in range(shards)]
    for queue in queues.values():
        for sq in queue.subqueues:
            if sq.dedicated and sq.shard < shards:
                out[sq.shard].append(sq.id)
    return out


def diverts(queues: Mapping[str, QueueInfo], flooders: Iterable[Flooder],
            shards: int) -> list[dict[int, list[tuple[str, str]]]]:
    """Per shard: live subqueue -> the (type, tenant) flooders whose puts to it spill."""
    out: list[dict[int, list[tuple[str, str]]]] = [{} for _ in range(shards)]
    for flooder in flooders:
        for sq in queues[flooder.queue].subqueues:
            if not sq.dedicated:
                out[sq.shard].setdefault(sq.id, []).append((flooder.type, flooder.tenant))
    return out


def listed(changes: FloodChanges, queues: Collection[str]) -> list[Flooder]:
    """The flooder list after a detection: those kept whose queue still exists, then
    the new ones."""
    return [f for f in changes.kept if f.queue in queues] + list(changes.added)


def spilled_on(tenant_counts: Mapping[tuple, int], flooder: Flooder) -> int:
    """The flooder's messages in one shard's spill store (from its tenant counts)."""
    return sum(n for (kind, _, type_, tenant), n in tenant_counts.items()
               if kind == SPILLED and flooder.covers(type_, tenant))


def left_to_sweep(spilled: int, moved: int) -> int:
    """What a sweep still has to move after a batch moved ``moved``: a batch that moved
    nothing means the rest had expired."""
    return spilled - moved if moved else 0


def fully_swept(done: Mapping[tuple, Sequence[bool]]) -> set[tuple]:
    """The flooders (by combination) whose every dedicated subqueue's sweep moved back
    all that was spilled; one with no open dedicated subqueue swept nothing."""
    return {combo for combo, results in done.items() if results and all(results)}


def with_sweeps(flooders: Iterable[Flooder], emptied: Collection[tuple]) -> list[Flooder]:
    """The list with each flooder's ``swept_empty`` from this run's sweep."""
    return [replace(f, swept_empty=f.combination in emptied) for f in flooders]
