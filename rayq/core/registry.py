"""The persisted queue registry: virtual queues made of subqueues on shards (seed 003).

Pure: the :class:`~actors.manager.QueueManager` actor wraps it and feeds it the
counts it reads from shards.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rayq.core.auth import ADMIN
from rayq.core.clock import Clock
from rayq.core.kv import KV
from rayq.core.model import DLQ_SUFFIX, SubqueueState, check_count, pack, unpack
from rayq.core.scaling import least_loaded_shard
from rayq.errors import AuthError, InvalidMessage, QueueDisabled, QueueExists, QueueNotFound

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
PURGE = b"purge:"  # subqueue id -> shard, until the shard has taken the removal over


@dataclass(frozen=True)
class SubqueueInfo:
    """One subqueue. ``dedicated`` names the (type, tenant) flooder it isolates: it
    takes no producer's puts (only the flood sweeper's) and scaling leaves it alone."""

    id: int
    shard: int
    state: SubqueueState
    version: int
    dedicated: tuple[str, str] | None = None


@dataclass(frozen=True)
class QueueInfo:
    """One virtual queue. ``dead_letter`` maps a shard to the DLQ subqueue on that shard."""

    name: str
    subqueues: tuple[SubqueueInfo, ...]
    min_subqueues: int
    max_receives: int | None
    dead_letter: tuple[tuple[int, int], ...]
    created_at: float
    is_dlq: bool = False
    owner: str = ADMIN  # the account whose queue this is

    def subqueue(self, sq: int) -> SubqueueInfo | None:
        return next((s for s in self.subqueues if s.id == sq), None)

    def dead_letter_on(self, shard: int) -> int | None:
        return dict(self.dead_letter).get(shard)

    def to_record(self) -> dict:
        return {"name": self.name, "min": self.min_subqueues, "max_receives": self.max_receives,
                "dlq": [list(p) for p in self.dead_letter], "created_at": self.created_at,
                "is_dlq": self.is_dlq, "owner": self.owner,
                "subqueues": [[s.id, s.shard, s.state.value, s.version,
                               list(s.dedicated) if s.dedicated else None]
                              for s in self.subqueues]}

    @classmethod
    def from_record(cls, r: dict) -> "QueueInfo":
        subqueues = tuple(SubqueueInfo(i, shard, SubqueueState(state), version,
                                       tuple(rest[0]) if rest and rest[0] else None)
                          for i, shard, state, version, *rest in r["subqueues"])
        return cls(r["name"], subqueues, r["min"], r["max_receives"],
                   tuple(tuple(p) for p in r["dlq"]), r["created_at"], r["is_dlq"],
                   r.get("owner", ADMIN))


def check_queue_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidMessage(f"queue names are 1-80 chars of letters, digits, '_', '-', '.': {name!r}")
    return name


class QueueRegistry:
    """Queues, their subqueues and placement, persisted in a KV's ``meta`` table."""

    def __init__(self, kv: KV, *, shards: int, clock: Clock):
        self.kv, self.shards, self.clock = kv, shards, clock
        self._queues: dict[str, QueueInfo] = kv.read(self._load)

    def _load(self, txn) -> dict[str, QueueInfo]:
        return {k[2:].decode(): QueueInfo.from_record(unpack(v))
                for k, v in txn.scan("meta", b"q:", b"q;")}

    def _save(self, *queues: QueueInfo, removed: tuple[str, ...] = (),
              purges: tuple[SubqueueInfo, ...] = ()) -> None:
        def write(txn):
            for q in queues:
                txn.put("meta", b"q:" + q.name.encode(), pack(q.to_record()))
            for name in removed:
                txn.delete("meta", b"q:" + name.encode())
            for sq in purges:
                txn.put("meta", PURGE + str(sq.id).encode(), str(sq.shard).encode())
        self.kv.transact(write)
        for q in queues:
            self._queues[q.name] = q
        for name in removed:
            self._queues.pop(name, None)

    def _next_ids(self, n: int) -> list[int]:
        def allocate(txn):
            raw = txn.get("meta", b"next_sq")
            first = int(raw) if raw else 1
            txn.put("meta", b"next_sq", str(first + n).encode())
            return list(range(first, first + n))
        return self.kv.transact(allocate)

    # -- queries -------------------------------------------------------------
    def get(self, name: str) -> QueueInfo:
        queue = self._queues.get(name)
        if queue is None:
            raise QueueNotFound(f"no queue named {name!r}")
        return queue

    def __contains__(self, name: str) -> bool:
        return name in self._queues

    def names(self) -> list[str]:
        return sorted(self._queues)

    def all(self) -> list[QueueInfo]:
        return list(self._queues.values())

    def owner_of(self, sq: int) -> QueueInfo | None:
        return next((q for q in self._queues.values() if q.subqueue(sq)), None)

    # -- changes ---------------------------------------------------------------
    def create(self, name: str, *, subqueues: int, max_receives: int | None,
               shard_depths: Mapping[int, int], owner: str = ADMIN) -> QueueInfo:
        """Create a queue and its ``<name>-dlq`` for account ``owner`` (idempotent for the
        same settings and owner)."""
        check_queue_name(name)
        if name.endswith(DLQ_SUFFIX):
            raise InvalidMessage(f"names ending in {DLQ_SUFFIX!r} are reserved for dead-letter queues")
        check_count(subqueues, "subqueues", 1, 64)
        if max_receives is not None:
            check_count(max_receives, "max_receives", 1, 1000)
        existing = self._queues.get(name)
        if existing is not None:
            if existing.owner != owner:
                raise AuthError(f"queue {name!r} belongs to another account")
            if existing.max_receives != max_receives:
                raise QueueExists(f"queue {name!r} exists with max_receives={existing.max_receives}")
            return existing
        depths = dict(shard_depths) or {s: 0 for s in range(self.shards)}
        placed = []
        for _ in range(subqueues):  # spread over the least loaded shards
            shard = least_loaded_shard(depths)
            depths[shard] += 1 << 40  # count a new subqueue as heavy so the next goes elsewhere
            placed.append(shard)
        ids = self._next_ids(subqueues)
        now = self.clock.now()
        main = QueueInfo(name, tuple(SubqueueInfo(i, s, SubqueueState.ALL, v)
                                     for v, (i, s) in enumerate(zip(ids, placed))),
                         subqueues, max_receives, (), now, owner=owner)
        dlq = QueueInfo(name + DLQ_SUFFIX, (), 1, None, (), now, is_dlq=True, owner=owner)
        main, dlq = self._with_dead_letters(main, dlq)
        self._save(main, dlq)
        return main

    def _with_dead_letters(self, main: QueueInfo, dlq: QueueInfo) -> tuple[QueueInfo, QueueInfo]:
        """Give the DLQ a subqueue on every shard the queue uses (dead-lettering stays local)."""
        have = {s.shard for s in dlq.subqueues}
        need = sorted({s.shard for s in main.subqueues} - have)
        ids = self._next_ids(len(need)) if need else []
        version = max((s.version for s in dlq.subqueues), default=-1) + 1
        added = tuple(SubqueueInfo(i, shard, SubqueueState.ALL, version)
                      for i, shard in zip(ids, need))
        dlq = replace(dlq, subqueues=dlq.subqueues + added)
        main = replace(main, dead_letter=tuple((s.shard, s.id) for s in dlq.subqueues))
        return main, dlq

    def delete(self, name: str) -> list[SubqueueInfo]:
        """Remove a queue (and its DLQ); returns the subqueues whose messages must go."""
        queue = self.get(name)
        removed = [queue.name]
        subqueues = list(queue.subqueues)
        dlq = self._queues.get(name + DLQ_SUFFIX)
        if dlq is not None and not queue.is_dlq:
            removed.append(dlq.name)
            subqueues += dlq.subqueues
        self._save(removed=tuple(removed))
        return subqueues

    def add_subqueue(self, name: str, shard: int) -> SubqueueInfo:
        queue = self.get(name)
        version = max((s.version for s in queue.subqueues), default=-1) + 1
        added = SubqueueInfo(self._next_ids(1)[0], shard, SubqueueState.ALL, version)
        queue = replace(queue, subqueues=queue.subqueues + (added,))
        dlq = self._queues.get(name + DLQ_SUFFIX)
        if dlq is not None and not queue.is_dlq:
            queue, dlq = self._with_dead_letters(queue, dlq)
            self._save(queue, dlq)
        else:
            self._save(queue)
        return added

    def add_dedicated(self, name: str, shard: int, type_: str, tenant: str) -> SubqueueInfo:
        """The subqueue isolating flooder (type, tenant) on ``shard``, made if missing."""
        queue = self.get(name)
        for s in queue.subqueues:
            if s.shard == shard and s.dedicated == (type_, tenant) and s.state is SubqueueState.ALL:
                return s
        version = max((s.version for s in queue.subqueues), default=-1) + 1
        added = SubqueueInfo(self._next_ids(1)[0], shard, SubqueueState.ALL, version, (type_, tenant))
        self._save(replace(queue, subqueues=queue.subqueues + (added,)))
        return added

    def coalesce(self, name: str, sq: int) -> QueueInfo:
        """Return a dedicated subqueue to the pool: it takes no puts, drains, then is dropped."""
        queue = self.get(name)
        subqueues = tuple(replace(s, state=SubqueueState.NO_PUT, dedicated=None) if s.id == sq else s
                          for s in queue.subqueues)
        queue = replace(queue, subqueues=subqueues)
        self._save(queue)
        return queue

    # -- clearing (seed 003: mark the subqueues to be deleted, start fresh ones) ---------
    def renew(self, name: str) -> list[SubqueueInfo]:
        """Give queue ``name`` fresh, empty subqueues in place of its subqueues (same
        shards; a flooder's dedicated subqueue stays dedicated; draining ones are not
        replaced). Returns the old subqueues, recorded as pending removal in the same
        transaction so a crash cannot leave them behind."""
        queue = self.get(name)
        keep = [s for s in queue.subqueues if s.state is SubqueueState.ALL]
        version = max((s.version for s in queue.subqueues), default=-1) + 1
        fresh = tuple(SubqueueInfo(i, s.shard, SubqueueState.ALL, version, s.dedicated)
                      for i, s in zip(self._next_ids(len(keep)), keep))
        renewed = replace(queue, subqueues=fresh)
        self._save(renewed, purges=queue.subqueues)
        return list(queue.subqueues)

    def note_purges(self, subqueues: list[SubqueueInfo]) -> None:
        """Record subqueues whose messages shards must remove (a deleted queue's)."""
        self._save(purges=tuple(subqueues))

    def pending_purges(self) -> list[SubqueueInfo]:
        """Subqueues recorded for removal that no shard has acknowledged yet."""
        def read(txn):
            return [SubqueueInfo(int(k[len(PURGE):]), int(v), SubqueueState.DISABLED, 0)
                    for k, v in txn.scan("meta", PURGE, PURGE[:-1] + b";")]
        return self.kv.read(read)

    def purged(self, ids: list[int]) -> None:
        """Shards took these subqueues over: their removal goes on there."""
        self.kv.transact(lambda txn: [txn.delete("meta", PURGE + str(i).encode()) for i in ids])

    def set_state(self, name: str, sq: int, state: SubqueueState) -> QueueInfo:
        queue = self.get(name)
        subqueues = tuple(replace(s, state=state) if s.id == sq else s for s in queue.subqueues)
        queue = replace(queue, subqueues=subqueues)
        self._save(queue)
        return queue

    def drop_subqueue(self, name: str, sq: int) -> QueueInfo:
        queue = self.get(name)
        queue = replace(queue, subqueues=tuple(s for s in queue.subqueues if s.id != sq))
        self._save(queue)
        return queue


def put_target(queue: QueueInfo, counts: Mapping[int, int]) -> SubqueueInfo:
    """The subqueue a new producer session sticks to: the emptiest one taking puts."""
    open_ = [s for s in queue.subqueues if s.state is SubqueueState.ALL and not s.dedicated]
    if not open_:
        raise QueueDisabled(f"queue {queue.name!r} has no subqueue accepting messages")
    return min(open_, key=lambda s: (counts.get(s.id, 0), s.version))


def receive_order(queue: QueueInfo, counts: Mapping[int, int]) -> list[SubqueueInfo]:
    """Subqueues to receive from: draining (oldest-version) ones first, then the fullest;
    flooders' dedicated subqueues last, so their backlog does not stand in front."""
    live = [s for s in queue.subqueues if s.state is not SubqueueState.DISABLED]
    return sorted(live, key=lambda s: (bool(s.dedicated), s.state is not SubqueueState.NO_PUT,
                                       -counts.get(s.id, 0), s.version))
