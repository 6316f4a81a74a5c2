"""The persisted queue registry: virtual queues made of subqueues on shards
(docs/shards-and-storage.md).

Pure: the :class:`~actors.manager.QueueManager` actor wraps it and feeds it the
counts it reads from shards.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from rayq.core.auth.accounts import ACCOUNT_NAME, ADMIN, QUEUE_SEP, queue_ref
from rayq.core.kit.clock import Clock
from rayq.core.kit.kv import KV
from rayq.core.codec.tasks import TaskSpec
from rayq.core.codec.model import DLQ_SUFFIX, SubqueueState, check_count, pack, unpack
from rayq.core.control.placement import least_loaded_shard
from rayq.errors import InvalidMessage, QueueDisabled, QueueExists, QueueNotFound

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
_METADATA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_METADATA_BYTES = 8 * 1024  # names and values together, UTF-8
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
    metadata: tuple[tuple[str, str], ...] = ()  # user-defined (name, value) pairs, sorted
    disabled: bool = False  # refuses puts; receives go on (set_disabled)
    # each fairness key (message group) delivers one batch at a time, in order; one
    # subqueue that never scales (a group's messages stay in one order)
    ordered: bool = False

    @property
    def scales(self) -> bool:
        """Whether the scaling loop may add or retire its subqueues: not while it is
        disabled (no puts to scale for), nor when ordered (one order kept)."""
        return not (self.disabled or self.ordered)

    @property
    def shards_told(self) -> bool:
        """Whether its shards hold more of it than the default (refused puts, order)."""
        return self.disabled or self.ordered

    @property
    def ordered_subqueues(self) -> tuple[SubqueueInfo, ...]:
        """The subqueues its shards must treat as ordered (none unless it is ordered)."""
        return self.subqueues if self.ordered else ()

    @property
    def ref(self) -> str:
        """The runtime-wide name: ``name`` for the default account's, else ``owner/name``."""
        return queue_ref(self.owner, self.name)

    def subqueue(self, sq: int) -> SubqueueInfo | None:
        return self._by_id.get(sq)

    @functools.cached_property
    def _by_id(self) -> dict[int, SubqueueInfo]:
        """Subqueues by id: a client routes every receipt of a batch through this."""
        return {s.id: s for s in self.subqueues}

    def dead_letter_on(self, shard: int) -> int | None:
        return dict(self.dead_letter).get(shard)

    def to_record(self) -> dict:
        return {"name": self.name, "min": self.min_subqueues, "max_receives": self.max_receives,
                "dlq": [list(p) for p in self.dead_letter], "created_at": self.created_at,
                "is_dlq": self.is_dlq, "owner": self.owner,
                "metadata": [list(p) for p in self.metadata], "disabled": self.disabled,
                "ordered": self.ordered,
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
                   r.get("owner", ADMIN), tuple(tuple(p) for p in r.get("metadata", ())),
                   r.get("disabled", False), r.get("ordered", False))


@dataclass(frozen=True)
class QueueMetadata:
    """A queue's user-defined metadata, whether it takes puts, and its approximate message
    count: the manager's last reading of its subqueues (at most a scaling interval old)."""

    name: str
    metadata: dict[str, str]
    approximate_count: int
    enabled: bool


def metadata_of(queue: QueueInfo, counts: Mapping[int, int], name: str) -> QueueMetadata:
    """``queue``'s metadata as the account that calls it ``name`` sees it."""
    return QueueMetadata(name, dict(queue.metadata),
                         sum(counts.get(s.id, 0) for s in queue.subqueues), not queue.disabled)


def check_queue_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidMessage(f"queue names are 1-80 chars of letters, digits, '_', '-', '.': {name!r}")
    return name


def check_metadata(metadata) -> tuple[tuple[str, str], ...]:
    """A queue's metadata as stored: (name, value) pairs sorted by name. Raises
    InvalidMessage unless it maps names of 1-64 letters, digits, '_' or '-' to strings,
    MAX_METADATA_BYTES in all."""
    if not isinstance(metadata, Mapping):
        raise InvalidMessage("metadata is a mapping of names to string values")
    for name, value in metadata.items():
        if not isinstance(name, str) or not _METADATA_NAME.match(name):
            raise InvalidMessage(f"metadata names are 1-64 letters, digits, '_', '-': {name!r:.80}")
        if not isinstance(value, str):
            raise InvalidMessage(f"metadata value of {name!r} is not a string")
    size = sum(len(n.encode()) + len(v.encode("utf-8", "replace")) for n, v in metadata.items())
    if size > MAX_METADATA_BYTES:
        raise InvalidMessage(f"metadata is {size} bytes; the limit is {MAX_METADATA_BYTES}")
    return tuple(sorted(metadata.items()))


def check_queue_ref(name) -> str:
    """A queue name as a client may give it: plain (its own account's) or ``account/name``."""
    if isinstance(name, str) and QUEUE_SEP in name:
        owner, _, bare = name.partition(QUEUE_SEP)
        if not ACCOUNT_NAME.match(owner):
            raise InvalidMessage(f"not an account name before {QUEUE_SEP!r}: {name!r:.100}")
        check_queue_name(bare)
        return name
    return check_queue_name(name)


def _record_key(ref: str) -> bytes:
    return b"q:" + ref.encode()


class QueueRegistry:
    """Queues, their subqueues and placement, persisted in a KV's ``meta`` table.

    Every account has its own namespace: a queue is keyed by its runtime-wide name
    (:attr:`QueueInfo.ref`, one-to-one with (owner, name)), while subqueue ids stay
    global integers. Methods take that runtime-wide name.
    """

    def __init__(self, kv: KV, *, shards: int, clock: Clock):
        self.kv, self.shards, self.clock = kv, shards, clock
        self._queues: dict[str, QueueInfo] = kv.transact(self._load)

    @staticmethod
    def _load(txn) -> dict[str, QueueInfo]:
        """Read every queue, migrating records of the one-namespace layout on the way: a
        record without an owner is the default account's (names were global then, and
        the default account's keys are unchanged); a record an account owned moves from
        ``q:<name>`` to ``q:<account>/<name>``, so its account keeps it."""
        queues, moved = {}, []
        for key, value in list(txn.scan("meta", b"q:", b"q;")):
            queue = QueueInfo.from_record(unpack(value))
            queues[queue.ref] = queue
            if key != _record_key(queue.ref):
                moved.append((key, queue))
        for key, queue in moved:
            txn.delete("meta", key)
            txn.put("meta", _record_key(queue.ref), pack(queue.to_record()))
        return queues

    def _save(self, *queues: QueueInfo, removed: tuple[str, ...] = (),
              purges: tuple[SubqueueInfo, ...] = ()) -> None:
        def write(txn):
            for q in queues:
                txn.put("meta", _record_key(q.ref), pack(q.to_record()))
            for ref in removed:
                txn.delete("meta", _record_key(ref))
            for sq in purges:
                txn.put("meta", PURGE + str(sq.id).encode(), str(sq.shard).encode())
        self.kv.transact(write)
        for q in queues:
            self._queues[q.ref] = q
        for ref in removed:
            self._queues.pop(ref, None)

    def _next_ids(self, n: int) -> list[int]:
        def allocate(txn):
            raw = txn.get("meta", b"next_sq")
            first = int(raw) if raw else 1
            txn.put("meta", b"next_sq", str(first + n).encode())
            return list(range(first, first + n))
        return self.kv.transact(allocate)

    # -- queries -------------------------------------------------------------
    def get(self, ref: str) -> QueueInfo:
        queue = self._queues.get(ref)
        if queue is None:
            raise QueueNotFound(f"no queue named {ref!r}")
        return queue

    def find(self, ref: str) -> QueueInfo | None:
        return self._queues.get(ref)

    def __contains__(self, ref: str) -> bool:
        return ref in self._queues

    def names(self) -> list[str]:
        """Every queue's runtime-wide name, sorted."""
        return sorted(self._queues)

    def all(self) -> list[QueueInfo]:
        return list(self._queues.values())

    # -- changes ---------------------------------------------------------------
    def create(self, name: str, *, subqueues: int, max_receives: int | None,
               shard_depths: Mapping[int, int], owner: str = ADMIN,
               ordered: bool = False) -> QueueInfo:
        """Create queue ``name`` and its ``<name>-dlq`` in account ``owner``'s namespace
        (idempotent for the same settings). ``ordered``: a FIFO queue (one subqueue)."""
        check_queue_name(name)
        if name.endswith(DLQ_SUFFIX):
            raise InvalidMessage(f"names ending in {DLQ_SUFFIX!r} are reserved for dead-letter queues")
        check_count(subqueues, "subqueues", 1, 64)
        if max_receives is not None:
            check_count(max_receives, "max_receives", 1, 1000)
        if not isinstance(ordered, bool) or ordered and subqueues != 1:
            raise InvalidMessage("ordered is True or False, and an ordered queue has one subqueue")
        existing = self._queues.get(queue_ref(owner, name))
        if existing is not None:
            if existing.max_receives != max_receives:
                raise QueueExists(f"queue {name!r} exists with max_receives={existing.max_receives}")
            if existing.ordered != ordered:
                raise QueueExists(f"queue {name!r} exists with ordered={existing.ordered}")
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
                         subqueues, max_receives, (), now, owner=owner, ordered=ordered)
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
        """Remove a queue (and its DLQ) and record its subqueues for removal by their
        shards, in one transaction (a crash between the two would strand their rows);
        returns those subqueues."""
        queue = self.get(name)
        removed = [queue.ref]
        subqueues = list(queue.subqueues)
        dlq = self._queues.get(name + DLQ_SUFFIX)
        if dlq is not None and not queue.is_dlq:
            removed.append(dlq.ref)
            subqueues += dlq.subqueues
        self._save(removed=tuple(removed), purges=tuple(subqueues))
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

    # -- clearing (docs/visibility-and-receipts.md: mark the subqueues to be deleted,
    # start fresh ones) ------------------------------------------------------------
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

    def pending_purges(self) -> list[SubqueueInfo]:
        """Subqueues recorded for removal that no shard has acknowledged yet."""
        def read(txn):
            return [SubqueueInfo(int(k[len(PURGE):]), int(v), SubqueueState.DISABLED, 0)
                    for k, v in txn.scan("meta", PURGE, PURGE[:-1] + b";")]
        return self.kv.read(read)

    def purged(self, ids: list[int]) -> None:
        """Shards took these subqueues over: their removal goes on there."""
        self.kv.transact(lambda txn: [txn.delete("meta", PURGE + str(i).encode()) for i in ids])

    def set_metadata(self, name: str, metadata: Mapping[str, str]) -> QueueInfo:
        """Replace queue ``name``'s metadata. Raises InvalidMessage (see check_metadata)."""
        queue = replace(self.get(name), metadata=check_metadata(metadata))
        self._save(queue)
        return queue

    def set_disabled(self, name: str, disabled: bool) -> QueueInfo:
        """Mark queue ``name`` disabled (it refuses puts) or enabled again."""
        if not isinstance(disabled, bool):
            raise InvalidMessage("disabled is True or False")
        queue = replace(self.get(name), disabled=disabled)
        self._save(queue)
        return queue

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


def put_states(queue: QueueInfo) -> dict[int, SubqueueState]:
    """What the shards hold as the state of the subqueues producers put to: ``NO_PUT``
    while the queue is disabled (the shard refuses a put from a route cached before),
    else ``ALL``. Draining and dedicated subqueues keep theirs."""
    state = SubqueueState.NO_PUT if queue.disabled else SubqueueState.ALL
    return {s.id: state for s in queue.subqueues
            if s.state is SubqueueState.ALL and not s.dedicated}


def receive_order(queue: QueueInfo, counts: Mapping[int, int]) -> list[SubqueueInfo]:
    """Subqueues to receive from: draining (oldest-version) ones first, then the fullest;
    flooders' dedicated subqueues last, so their backlog does not stand in front."""
    live = [s for s in queue.subqueues if s.state is not SubqueueState.DISABLED]
    return sorted(live, key=lambda s: (bool(s.dedicated), s.state is not SubqueueState.NO_PUT,
                                       -counts.get(s.id, 0), s.version))


def flood_watched(queues: Iterable[QueueInfo]) -> dict[str, QueueInfo]:
    """The queues the flood detector watches, by runtime-wide name: not dead-letter
    queues, nor ordered ones (one account's, and isolating part of a group elsewhere
    would break its order)."""
    return {q.ref: q for q in queues if not (q.is_dlq or q.ordered)}


class TaskRegistry:
    """Registered job types and their handlers, persisted so a restarted runtime
    finds them again. Handlers are kept as the opaque bytes the client sent;
    only consumers turn them back into functions."""

    def __init__(self, kv):
        self.kv = kv
        self._tasks: dict[str, tuple[TaskSpec, bytes]] = kv.read(self._load)
        # Consumers compare versions for equality only; a random start keeps a
        # restarted registry from reusing a version a consumer still holds.
        self.version = int.from_bytes(os.urandom(4), "big")

    @staticmethod
    def _load(txn) -> dict[str, tuple[TaskSpec, bytes]]:
        out = {}
        for key, value in txn.scan("meta", b"task:", b"task;"):
            record = unpack(value)
            out[key[5:].decode()] = (TaskSpec(**record["spec"]), record["handler"])
        return out

    def register(self, spec: TaskSpec, handler: bytes) -> int:
        """Add or replace a job type's handler; returns the registry's new version."""
        if not isinstance(spec, TaskSpec) or not isinstance(handler, bytes) or not handler:
            raise InvalidMessage("register takes a TaskSpec and the pickled handler")
        if self._tasks.get(spec.type) == (spec, handler):
            return self.version
        record = pack({"spec": vars(spec), "handler": handler})
        self.kv.transact(lambda txn: txn.put("meta", b"task:" + spec.type.encode(), record))
        self._tasks[spec.type] = (spec, handler)
        self.version += 1
        return self.version

    def get(self, type_: str) -> TaskSpec | None:
        found = self._tasks.get(type_)
        return found[0] if found else None

    def all(self) -> dict[str, tuple[TaskSpec, bytes]]:
        return dict(self._tasks)

    def queues(self) -> list[str]:
        return sorted({spec.queue for spec, _ in self._tasks.values()})
