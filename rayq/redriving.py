"""``client.redrive``: dead letters moved back to the queue they came from, shard by shard
(docs/tasks.md, "Redrive").

A queue's dead-letter queue has a subqueue on every shard the queue used
(``QueueInfo.dead_letter``), and a dead letter stays on its shard. So a redrive asks each
of those shards in turn to move the visible rows of its DLQ subqueue into the queue's open
subqueue there (the shard's ``redrive``: :class:`rayq.core.storage.writes.Redrive`), a
bounded batch per call, going on from the cursor each call returns, until the shard has
no more or ``max_messages`` moved. Each shard takes the first call's time as the start:
what is dead-lettered there later (a redriven task failing again) stays for the next
redrive. A shard with a DLQ subqueue but no open subqueue of the queue (the queue scaled
down off it) keeps its dead letters: moving them to another shard would give them new
ids, and a task must keep its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rayq.core.auth.accounts import ADMIN
from rayq.core.auth.operations import MANAGER_OPS, SHARD_OPS
from rayq.core.codec.model import DLQ_SUFFIX, SubqueueState, check_count
from rayq.core.codec.tasks import TaskSpec
from rayq.core.control.registry import QueueInfo, check_queue_ref
from rayq.errors import AuthError, InvalidMessage, QueueDisabled, TaskNotFound
from rayq.tasks import TaskFunction
from rayq.transport import Transport

BATCH = 1_000  # rows one call looks at: one transaction on the shard
MAX_MESSAGES = 2**62


def source_of(what: Any, account: str,
              spec_of: Callable[[str], TaskSpec | None]) -> tuple[str, str | None]:
    """(the queue, as ``account`` names it, whose dead letters move, the job type they
    must be of or None for all) that ``what`` means: a ``@rayq.task`` function is its type;
    for the ``default`` account a string that names a registered type (``spec_of``) is
    that type, before any queue of the name; any other string is a queue. Raises
    InvalidMessage, TaskNotFound for a function whose type is not registered, AuthError
    for a type redrive by another account (task queues are the ``default`` account's)."""
    if isinstance(what, TaskFunction):
        if account != ADMIN:
            raise AuthError(f"redriving task type {what.spec.type!r} is the {ADMIN!r} "
                            f"account's: task queues and their dead letters are its")
        spec = spec_of(what.spec.type)
        if spec is None:
            raise TaskNotFound(f"task type {what.spec.type!r} is not registered")
        return spec.queue, spec.type
    if not isinstance(what, str):
        raise InvalidMessage(f"redrive takes a @rayq.task function, a task type or a queue "
                             f"name, not {what!r:.80}")
    spec = spec_of(what) if account == ADMIN else None
    if spec is not None:
        return spec.queue, spec.type
    check_queue_ref(what)
    if what.endswith(DLQ_SUFFIX):
        raise InvalidMessage(f"redrive names the queue its dead letters go back to, not "
                             f"its dead-letter queue: {what[:-len(DLQ_SUFFIX)]!r}")
    return what, None


def redrive(transport: Transport, name: str, type_: str | None,
            max_messages: int | None) -> int:
    """Move up to ``max_messages`` (None: every one visible when its shard is reached)
    dead letters of queue ``name``, of ``type_`` only when given, back to it: how many
    moved. Raises QueueNotFound, QueueDisabled when the queue takes no messages."""
    left = MAX_MESSAGES if max_messages is None else \
        check_count(max_messages, "max_messages", 1, MAX_MESSAGES)
    queue = _open(transport, name)
    moved = 0
    for shard, source in sorted(queue.dead_letter):
        if moved >= left:
            break
        moved += _from_shard(transport, name, queue, shard, source, type_, left - moved)
    return moved


def _open(transport: Transport, name: str) -> QueueInfo:
    """The queue as the manager has it now. Raises QueueDisabled when it takes nothing."""
    queue = transport.route(name, refresh=True).queue
    if queue.disabled:
        raise QueueDisabled(f"queue {name!r} is disabled: it takes no messages, dead "
                            f"letters neither")
    return queue


def target_on(queue: QueueInfo, shard: int) -> int | None:
    """The subqueue of ``queue`` on ``shard`` dead letters go back to: an open one (taking
    puts, no flooder's), the newest; None when it has none there."""
    open_ = [s for s in queue.subqueues if s.shard == shard and s.state is SubqueueState.ALL
             and not s.dedicated]
    return max(open_, key=lambda s: s.version).id if open_ else None


def _from_shard(transport: Transport, name: str, queue: QueueInfo, shard: int, source: int,
                type_: str | None, left: int) -> int:
    """Move up to ``left`` dead letters of ``source`` on ``shard``: how many moved."""
    moved, until, after = 0, None, None
    target = target_on(queue, shard)
    while target is not None and moved < left:
        try:
            got, until, after = transport.call(
                SHARD_OPS["redrive"], transport.shards[shard], source, target,
                min(BATCH, left - moved), type_=type_, until_us=until, after=after, queue=name)
        except QueueDisabled:  # retired or disabled since the route: another one, or none
            before, target = target, target_on(_open(transport, name), shard)
            if target == before:
                raise
            continue
        moved += got
        if after is None:
            break
    return moved


def find_spec(transport: Transport) -> Callable[[str], TaskSpec | None]:
    """The registered spec of a job type, asked of the manager (the ``default`` account's)."""
    return lambda type_: transport.call(MANAGER_OPS["task_spec"], transport.manager, type_)
