"""A shard's writes, each a small frozen record that knows how to run.

A record holds one write's arguments and knows three things: how it runs over one write
transaction's :class:`~rayq.core.storage.ledger.Ledger` (:meth:`Write.run`, calling the
operations of :mod:`~rayq.core.storage.messages`, :mod:`~rayq.core.storage.outcomes`,
:mod:`~rayq.core.storage.spill` and :mod:`~rayq.core.storage.purge`), whether it is
small (a group of small writes is cheap enough for a shard to commit on its event loop),
and which parked polls it wakes once committed. The store takes records through its one
door for writes, :meth:`ShardStore.run <rayq.core.storage.store.ShardStore.run>` and
:meth:`ShardStore.group <rayq.core.storage.store.ShardStore.group>`, from the shard
actor and from tests alike.

The ends of a delivery (:data:`ENDS`) are what a consumer decides
(:mod:`rayq.core.consumers.decisions`); they cross Ray and the local channel, whose
frames carry msgpack types only, in a compact form: :func:`compact` makes it, and the
shard reads it back with :func:`decode_ends`, which refuses anything else.

A new verb needs one record here, one shard actor method that builds it
(``actors/shard.py``), one entry in the table of signed operations
(:mod:`rayq.core.auth.operations`) and the client's call.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar

from rayq.core.codec.model import DEFAULT_ACCOUNT
from rayq.core.storage import messages, outcomes, purge, redrive, spill
from rayq.core.storage.ledger import Env, Ledger
from rayq.errors import InvalidMessage, RayqError

# -- a small group ----------------------------------------------------------------------
SMALL_GROUP = 4             # writes (and nonces alone) in one group commit
SMALL_PUT_BYTES = 64 << 10  # bytes of one put's batch
SMALL_ROWS = 100            # rows one receive or delete may touch


class Write:
    """One write of a shard: a frozen record of its arguments."""

    def run(self, w: Ledger, env: Env) -> Any:
        """Make the write in ``w``'s transaction; its result. Raises a RayqError when
        the write is refused (its fields do not fit: InvalidMessage)."""
        raise NotImplementedError

    def small(self) -> bool:
        """Whether it touches only a few rows (the unbounded housekeeping writes do not)."""
        return False

    def wakes(self, result: Any) -> Iterable[tuple[int, int]]:
        """(subqueue, how many parked polls) to wake once the write committed with
        ``result``."""
        return ()

    def loads(self) -> int | None:
        """The subqueue whose load the write adds to (a shard counts its refused writes
        there), or None."""
        return None


@dataclass(frozen=True)
class Put(Write):
    """Store a put buffer (:mod:`rayq.core.codec.wire`): the message ids in order
    (:func:`messages.put`: ``sender`` and ``account`` are its policy)."""

    subqueue: int
    batch: bytes
    sender: tuple | None = None
    account: str = DEFAULT_ACCOUNT

    def run(self, w: Ledger, env: Env) -> list[str]:
        return messages.put(w, env, self.subqueue, self.batch, self.sender, self.account)

    def small(self) -> bool:
        return isinstance(self.batch, bytes) and len(self.batch) <= SMALL_PUT_BYTES

    def wakes(self, ids: list[str]) -> Iterable[tuple[int, int]]:
        return ((self.subqueue, len(ids)),)  # a poll per message stored

    def loads(self) -> int:
        return self.subqueue


@dataclass(frozen=True)
class Receive(Write):
    """Hide and hand out up to ``max_messages`` messages: one delivered buffer
    (:func:`rayq.core.codec.wire.decode_delivered` reads it; see :func:`messages.receive`)."""

    subqueue: int
    max_messages: int = 1
    visibility_timeout_s: float | None = None
    _: KW_ONLY
    keys: Sequence[str] | None = None
    max_receives: int | None = None
    dead_letter: int | None = None
    exclude: Sequence[str] | None = None

    def run(self, w: Ledger, env: Env) -> bytes:
        return messages.receive(w, env, self.subqueue, self.max_messages,
                                self.visibility_timeout_s, keys=self.keys,
                                max_receives=self.max_receives, dead_letter=self.dead_letter,
                                exclude=self.exclude)

    def small(self) -> bool:
        return isinstance(self.max_messages, int) and self.max_messages <= SMALL_ROWS

    def loads(self) -> int:
        return self.subqueue


@dataclass(frozen=True)
class Delete(Write):
    """Delete the messages of valid receipts: the receipts that were invalid."""

    receipts: Sequence[str]

    def run(self, w: Ledger, env: Env) -> list[str]:
        return messages.delete(w, env, self.receipts)

    def small(self) -> bool:
        return isinstance(self.receipts, (list, tuple)) and len(self.receipts) <= SMALL_ROWS


@dataclass(frozen=True)
class Clear(Write):
    """Delete every message of a subqueue, spilled ones too: how many (:func:`purge.clear`)."""

    subqueue: int

    def run(self, w: Ledger, env: Env) -> int:
        return purge.clear(w, env, self.subqueue)

    def loads(self) -> int:
        return self.subqueue


# -- the ends of a delivery ---------------------------------------------------------------
class End(Write):
    """A write that ends a delivery (or keeps the usage report of one): small, and
    known by ``name`` in its compact form (:func:`compact`)."""

    name: ClassVar[str]

    def small(self) -> bool:
        return True


@dataclass(frozen=True)
class ChangeVisibility(End):
    """Hide a received message for ``timeout_s`` from now: its new receipt. ``usage``: the
    report of the delivery this ends (a task to retry), kept with it."""

    name: ClassVar[str] = "change_visibility"
    receipt: str
    timeout_s: float
    usage: bytes | None = None

    def run(self, w: Ledger, env: Env) -> str:
        return messages.change_visibility(w, env, self.receipt, self.timeout_s, self.usage)


@dataclass(frozen=True)
class Defer(End):
    """Put a received message back unrun for ``delay_s``, its delivery not counted: its
    new receipt (:func:`messages.defer`)."""

    name: ClassVar[str] = "defer"
    receipt: str
    delay_s: float
    usage: bytes | None = None

    def run(self, w: Ledger, env: Env) -> str:
        return messages.defer(w, env, self.receipt, self.delay_s, self.usage)


@dataclass(frozen=True)
class Finish(End):
    """End a received task with its encoded outcome, deleted or moved to subqueue
    ``dead_letter`` (:func:`outcomes.finish`)."""

    name: ClassVar[str] = "finish"
    receipt: str
    outcome: bytes
    dead_letter: int | None = None
    usage: bytes | None = None

    def run(self, w: Ledger, env: Env) -> None:
        return outcomes.finish(w, env, self.receipt, self.outcome, self.dead_letter, self.usage)


@dataclass(frozen=True)
class RecordUsage(End):
    """Keep a delivery's usage report alone: that of an end another consumer made first
    (:func:`outcomes.record_usage`)."""

    name: ClassVar[str] = "record_usage"
    report: bytes

    def run(self, w: Ledger, env: Env) -> None:
        return outcomes.record_usage(w, env, self.report)


@dataclass(frozen=True)
class Extend(End):
    """A running task's heartbeat: hide it ``timeout_s`` more; (its new receipt, whether
    it was cancelled meanwhile) (:func:`messages.extend`)."""

    name: ClassVar[str] = "extend"
    receipt: str
    timeout_s: float

    def run(self, w: Ledger, env: Env) -> tuple[str, bool]:
        return messages.extend(w, env, self.receipt, self.timeout_s)


ENDS: Mapping[str, type[End]] = MappingProxyType(
    {end.name: end for end in (Finish, Defer, ChangeVisibility, RecordUsage, Extend)})


def compact(end: End) -> tuple[str, tuple]:
    """An end as it crosses Ray and the local channel: (its name, its fields in order;
    a usage report is the last)."""
    return end.name, tuple(getattr(end, field.name) for field in fields(end))


def decode_ends(calls: Any) -> list[End]:
    """The ends of a batch in compact form; InvalidMessage, the batch refused whole,
    unless each is a name of :data:`ENDS` and a sequence of fields that fit it (tuples
    through Ray, lists through the local channel's frames)."""
    if not isinstance(calls, list):
        raise _misfit("not a list")
    return [_decode_end(call) for call in calls]


def _decode_end(call: Any) -> End:
    if not (isinstance(call, (tuple, list)) and len(call) == 2 and call[0] in ENDS
            and isinstance(call[1], (tuple, list))):
        raise _misfit(f"{call!r:.80}")
    try:
        return ENDS[call[0]](*call[1])
    except TypeError as err:
        raise _misfit(str(err)) from None


def _misfit(what: str) -> InvalidMessage:
    return InvalidMessage(f"end_many takes a list of (name, fields), name in {tuple(ENDS)}: "
                          f"{what}")


# -- cancelling ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Cancel(Write):
    """Cancel ``account``'s task ``task_id``: a :class:`outcomes.CancelResult`, or None
    when this store keeps no such task (:func:`outcomes.cancel`)."""

    account: str
    task_id: str

    def run(self, w: Ledger, env: Env) -> outcomes.CancelResult | None:
        return outcomes.cancel(w, env, self.account, self.task_id)

    def small(self) -> bool:
        return True


# -- usage reports and housekeeping -------------------------------------------------------
@dataclass(frozen=True)
class TakeUsage(Write):
    """Remove and return up to ``limit`` usage reports, oldest first."""

    limit: int = 10_000

    def run(self, w: Ledger, env: Env) -> list[bytes]:
        return outcomes.take_usage(w, env, self.limit)


@dataclass(frozen=True)
class CollectExpired(Write):
    """Delete up to ``limit`` expired messages and as many expired outcomes: how many."""

    limit: int = 10_000

    def run(self, w: Ledger, env: Env) -> int:
        return messages.collect_expired(w, env, self.limit)


@dataclass(frozen=True)
class Sweep(Write):
    """Move up to ``limit`` spilled messages of a flooder into ``target``: how many
    (:func:`spill.sweep`)."""

    type_: str
    tenant: str
    target: int
    limit: int

    def run(self, w: Ledger, env: Env) -> int:
        return spill.sweep(w, env, self.type_, self.tenant, self.target, self.limit)

    def loads(self) -> int:
        return self.target


@dataclass(frozen=True)
class MoveMatching(Write):
    """Move a flooder's visible messages from ``source`` to ``target``, ``limit`` rows
    looked at after ``after``: (moved, where to go on from) (:func:`spill.move_matching`)."""

    source: int
    target: int
    type_: str
    tenant: str
    limit: int
    after: bytes | None = None

    def run(self, w: Ledger, env: Env) -> tuple[int, bytes | None]:
        return spill.move_matching(w, env, self.source, self.target, self.type_, self.tenant,
                                   self.limit, self.after)

    def loads(self) -> int:
        return self.source


@dataclass(frozen=True)
class PurgeStep(Write):
    """One bounded step of background removal (:func:`purge.purge_step`): the store's own,
    run by :meth:`ShardStore.purge_some <rayq.core.storage.store.ShardStore.purge_some>`."""

    done: Collection[int]
    limit: int
    after: bytes | None

    def run(self, w: Ledger, env: Env) -> tuple[int, bytes | None]:
        return purge.purge_step(w, env, self.done, self.limit, self.after)


@dataclass(frozen=True)
class Redrive(Write):
    """Move dead letters of DLQ subqueue ``source`` back into ``target``, ``limit`` rows
    looked at after ``after``, of ``type_`` only when given, those visible at ``until_us``
    (None: now): (moved, the ``until_us`` used, where to go on from or None when done)
    (:func:`redrive.redrive`)."""

    source: int
    target: int
    limit: int
    type_: str | None = None
    until_us: int | None = None
    after: bytes | None = None

    def run(self, w: Ledger, env: Env) -> tuple[int, int, bytes | None]:
        return redrive.redrive(w, env, self.source, self.target, self.limit, self.type_,
                               self.until_us, self.after)

    def small(self) -> bool:
        return isinstance(self.limit, int) and self.limit <= SMALL_ROWS

    def wakes(self, result: tuple[int, int, bytes | None]) -> Iterable[tuple[int, int]]:
        return ((self.target, result[0]),)  # a poll per message back in the queue

    def loads(self) -> int:
        return self.target


# -- running ------------------------------------------------------------------------------
def check_write(op: Any) -> Write:
    """``op`` if it is a write; InvalidMessage otherwise."""
    if not isinstance(op, Write):
        raise InvalidMessage(f"not a write of a shard: {op!r:.80}")
    return op


def run_isolated(w: Ledger, env: Env, op: Write) -> Any:
    """Run one write of a group in a nested transaction; a RayqError (InvalidMessage for
    anything that is not a write) undoes it alone and is returned. Any other exception
    is a bug of the store and propagates, aborting the whole transaction."""
    parent, point = w.txn, w.savepoint()
    try:
        with parent.nested() as child:
            w.txn = child
            return check_write(op).run(w, env)
    except RayqError as err:
        w.rollback(point)
        return err
    finally:
        w.txn = parent


def small_group(ops: Sequence[Write | None]) -> bool:
    """Whether a group commit of ``ops`` touches only a few rows: cheap enough for a
    shard to run on its event loop. None stands for a signed read's nonce alone, one
    row written with the group."""
    return len(ops) <= SMALL_GROUP and all(op is None or op.small() for op in ops)
