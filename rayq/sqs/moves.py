"""Message move tasks: redriving a dead-letter queue's messages back to the queues they
came from (or to one destination), as StartMessageMoveTask does.

StartMessageMoveTask checks its parameters, counts the source's visible messages (the
task's ApproximateNumberOfMessagesToMove) and records the task RUNNING in a
:class:`MoveTasks` table; it answers at once. The endpoint's state actor keeps that table
(its LMDB, fsync'd) and runs each RUNNING task on a thread of its own (:func:`run`), which
moves batches of :func:`move_batch` at MaxNumberOfMessagesPerSecond
(:data:`DEFAULT_RATE_PER_S` when absent), adds each batch to the task's
ApproximateNumberOfMessagesMoved, and ends it COMPLETED, CANCELLED (after a
CancelMessageMoveTask marked it CANCELLING) or FAILED with a FailureReason. One task per
source queue is active (RUNNING or CANCELLING) at a time.

A message is moved hide-then-send-then-delete: received from the source hidden for
:data:`HIDE_S`, sent to its destination, then deleted from the source. A cancel takes effect
between batches, so a message is never lost or sent twice by it; a crash between the send
and the delete leaves the message in both queues (SQS's at-least-once), one before the send
shows in the source again after HIDE_S.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

from rayq.core.codec.model import Outgoing, pack, unpack
from rayq.core.kit.clock import Clock
from rayq.core.kit.kv import KV
from rayq.errors import AuthError, QueueNotFound
from rayq.sqs import messages as msgs
from rayq.sqs import queues
from rayq.sqs.errors import SqsError, invalid, missing
from rayq.sqs.names import QueueId
from rayq.sqs.target import Target

BATCH = 10
HIDE_S = 60        # a message being moved is hidden this long, should the move be cut short
KEPT_TASKS = 10    # tasks kept per source queue, newest first (ListMessageMoveTasks' maximum)
MAX_RATE_PER_S = 500
# SQS's rate without MaxNumberOfMessagesPerSecond is "system-optimized" from the backlog;
# here it is SQS's cap, the fastest a task may be asked to go.
DEFAULT_RATE_PER_S = MAX_RATE_PER_S
NO_QUEUE = "AWS.SimpleQueueService.NonExistentQueue"  # SQS's FailureReason for a lost queue
TABLE = "meta"
_PREFIX = b"sqsmove:"


class MoveStatus(Enum):
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

    @property
    def active(self) -> bool:
        return self in (MoveStatus.RUNNING, MoveStatus.CANCELLING)


@dataclass(frozen=True)
class MoveTask:
    """One move task. ``account`` and ``region`` are the starting caller's (the task acts
    as that account); ``started_ms`` is milliseconds since the epoch."""

    handle: str
    account: str
    region: str
    source_arn: str
    destination_arn: str | None
    rate_per_s: int | None
    to_move: int
    started_ms: int
    status: MoveStatus = MoveStatus.RUNNING
    moved: int = 0
    failure: str | None = None

    @property
    def effective_rate_per_s(self) -> int:
        return self.rate_per_s or DEFAULT_RATE_PER_S

    def entry(self) -> dict:
        """The task as ListMessageMoveTasks shows it (a TaskHandle only while RUNNING)."""
        out: dict[str, Any] = {"Status": self.status.value, "SourceArn": self.source_arn,
                               "ApproximateNumberOfMessagesMoved": self.moved,
                               "ApproximateNumberOfMessagesToMove": self.to_move,
                               "StartedTimestamp": self.started_ms}
        if self.status is MoveStatus.RUNNING:
            out["TaskHandle"] = self.handle
        if self.destination_arn is not None:
            out["DestinationArn"] = self.destination_arn
        if self.rate_per_s is not None:
            out["MaxNumberOfMessagesPerSecond"] = self.rate_per_s
        if self.failure is not None:
            out["FailureReason"] = self.failure
        return out

    def to_record(self) -> dict:
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_record(cls, record: dict) -> "MoveTask":
        return cls(**{**record, "status": MoveStatus(record["status"])})


def new_handle(source_arn: str) -> str:
    """A task handle: the task's id and its source queue's ARN, as SQS's handles carry."""
    return base64.urlsafe_b64encode(json.dumps(
        {"task": uuid.uuid4().hex, "source": source_arn}).encode()).decode()


def handle_source(handle: Any) -> str:
    """The source ARN a task handle names. Raises InvalidParameterValue for a handle this
    endpoint did not make, MissingParameter without one."""
    if handle is None or handle == "":
        raise missing("TaskHandle")
    try:
        source = json.loads(base64.urlsafe_b64decode(handle.encode()))["source"]
    except (AttributeError, ValueError, TypeError, KeyError, binascii.Error):
        source = None
    if not isinstance(source, str):
        raise invalid("Value for parameter TaskHandle is invalid.")
    return source


class MoveTasks:
    """The move tasks of every source queue, newest first, in a KV table (one row per
    source ARN). Thread-safe: the actions and the movers' threads share it."""

    def __init__(self, kv: KV):
        self._kv, self._lock = kv, threading.Lock()

    def _read(self, txn, arn: str) -> list[MoveTask]:
        raw = txn.get(TABLE, _PREFIX + arn.encode())
        return [MoveTask.from_record(r) for r in unpack(raw)] if raw else []

    def _write(self, txn, arn: str, tasks: list[MoveTask]) -> None:
        txn.put(TABLE, _PREFIX + arn.encode(), pack([t.to_record() for t in tasks]))

    def start(self, task: MoveTask) -> bool:
        """Record ``task``; False (nothing recorded) while its source has an active one."""
        def go(txn) -> bool:
            tasks = self._read(txn, task.source_arn)
            if any(t.status.active for t in tasks):
                return False
            self._write(txn, task.source_arn, [task] + tasks[:KEPT_TASKS - 1])
            return True
        with self._lock:
            return self._kv.transact(go)

    def listed(self, source_arn: str) -> list[MoveTask]:
        return self._kv.read(lambda txn: self._read(txn, source_arn))

    def get(self, handle: str) -> MoveTask | None:
        found = [t for t in self.listed(handle_source(handle)) if t.handle == handle]
        return found[0] if found else None

    def active(self) -> list[MoveTask]:
        """Every RUNNING or CANCELLING task (what a restarted state actor runs again)."""
        def go(txn) -> list[MoveTask]:
            rows = txn.scan(TABLE, _PREFIX, _PREFIX[:-1] + b";")
            return [t for _, raw in rows for t in map(MoveTask.from_record, unpack(raw))
                    if t.status.active]
        return self._kv.read(go)

    def update(self, handle: str, change: Callable[[MoveTask], MoveTask | None]) -> MoveTask | None:
        """Apply ``change`` to the task (None from it: leave it); the task as it is after,
        None when there is no such task."""
        arn = handle_source(handle)

        def go(txn) -> MoveTask | None:
            tasks = self._read(txn, arn)
            for i, task in enumerate(tasks):
                if task.handle == handle:
                    changed = change(task)
                    if changed is None:
                        return task
                    tasks[i] = changed
                    self._write(txn, arn, tasks)
                    return changed
            return None
        with self._lock:
            return self._kv.transact(go)

    def cancel(self, handle: str) -> MoveTask | None:
        """Mark a RUNNING task CANCELLING (its mover ends it CANCELLED); the task, or None
        when it does not exist or is not running."""
        was: list[MoveStatus] = []

        def cancelling(task: MoveTask) -> MoveTask | None:
            was.append(task.status)
            return replace(task, status=MoveStatus.CANCELLING) \
                if task.status is MoveStatus.RUNNING else None
        done = self.update(handle, cancelling)
        return done if was == [MoveStatus.RUNNING] else None

    def add_moved(self, handle: str, moved: int) -> MoveTask | None:
        return self.update(handle, lambda t: replace(t, moved=t.moved + moved) if moved else None)

    def finish(self, handle: str, status: MoveStatus, failure: str | None = None) -> MoveTask | None:
        return self.update(handle, lambda t: replace(t, status=status, failure=failure)
                           if t.status.active else None)


# -- moving -----------------------------------------------------------------------------
class MoveFailed(Exception):
    """Raised inside a mover when its task cannot go on; ``reason`` is its FailureReason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Rest:
    """What a batch received and has not moved yet: the destinations still to send to,
    then the receipts sent on and not yet deleted from the source."""

    sending: list  # [(destination, [(message, envelope)])]
    deleting: list
    moved: int
    received: int


class Unfinished(AuthError):
    """Raised when a batch is refused as signed after its receive (the account's key was
    rotated in between): ``rest`` is what it received and did not move; the next attempt
    moves it with the key of now, rather than leave it hidden in the source."""

    def __init__(self, message: str, rest: Rest | None = None):
        super().__init__(message)
        self.rest = rest


def move_batch(t: Target, source: QueueId, to: QueueId | None, n: int,
               rest: Rest | None = None) -> tuple[int, int, int]:
    """Move up to ``n`` messages from ``source`` to ``to`` (None: each to the queue it was
    dead-lettered from), or what ``rest`` left of an attempt cut short; (moved, left in
    the source: no destination known, received). Raises MoveFailed when a queue is gone,
    Unfinished when refused as signed after its receive (any other RayqError as it comes)."""
    try:
        queue = t.queue(source)
        if rest is None:
            got = queue.receive(max_messages=n, visibility_timeout_s=HIDE_S)
            rest = Rest(list(_by_destination(t, got, to).items()), [], 0, len(got))
    except (QueueNotFound, SqsError) as err:
        raise MoveFailed(NO_QUEUE) from err
    try:
        _finish(t, queue, rest)
    except AuthError as err:
        raise Unfinished(str(err), rest) from err
    return rest.moved, rest.received - rest.moved, rest.received


def _by_destination(t: Target, got: list, to: QueueId | None) -> dict[QueueId, list]:
    by_destination: dict[QueueId, list] = {}
    for m in got:
        envelope = msgs.opened(m.body)
        destination = to or _source_of(t, envelope)
        if destination is not None:
            by_destination.setdefault(destination, []).append((m, envelope))
    return by_destination


def _finish(t: Target, queue, rest: Rest) -> None:
    """Send on and delete what ``rest`` holds, a destination at a time, ``rest`` kept up
    to date as each step is done."""
    while rest.deleting or rest.sending:
        if rest.deleting:
            queue.delete_batch(rest.deleting)
            rest.moved, rest.deleting = rest.moved + len(rest.deleting), []
            continue
        destination, batch = rest.sending[0]
        try:
            ordered = t.ordered(destination)
            t.queue(destination).send_batch([Outgoing(
                envelope.moved(source=None).stored(), type=m.type,
                key=msgs.key_in(ordered, m, envelope)) for m, envelope in batch])
        except (QueueNotFound, SqsError) as err:  # the rest stay hidden, and show again
            raise MoveFailed(NO_QUEUE) from err
        rest.sending.pop(0)
        rest.deleting = [m.receipt for m, _ in batch]


def _source_of(t: Target, envelope: msgs.Envelope) -> QueueId | None:
    if not envelope.source:
        return None
    try:
        return t.from_arn(envelope.source)
    except SqsError:
        return None


def pause_s(done: int, rate_per_s: int, elapsed_s: float) -> float:
    """How long to wait before the next batch so that ``done`` messages in ``elapsed_s``
    keep to ``rate_per_s``."""
    return max(0.0, done / rate_per_s - elapsed_s)


def signed_anew(make: Callable[[], Callable[..., tuple[int, int, int]]]
                ) -> Callable[[int], tuple[int, int, int]]:
    """A task's ``batch`` for :func:`run`, made by ``make()`` with the account's key of now,
    and made again once when the runtime refuses it as signed (the account's key was
    rotated since; shards learn a rotation each at its own moment). A batch refused
    after its receive goes on, with the new key, with what it received (its Rest)."""
    current = [make()]

    def batch(n: int) -> tuple[int, int, int]:
        try:
            return current[0](n)
        except AuthError as err:
            current[0] = make()
            return current[0](n, getattr(err, "rest", None))
    return batch


def run(task: MoveTask, tasks: MoveTasks, batch: Callable[[int], tuple[int, int, int]],
        clock: Clock, wait: Callable[[float], bool]) -> MoveTask | None:
    """Run ``task`` to its end: ``batch(n)`` moves up to n messages (as :func:`move_batch`),
    ``wait(s)`` pauses s seconds and answers True when the mover must stop (the actor is
    going: the task stays active, to run again). Returns the task as it ended (None when
    stopped)."""
    rate, handle = task.effective_rate_per_s, task.handle
    remaining, done, started = task.to_move - task.moved, 0, clock.monotonic()
    while True:
        current = tasks.get(handle)
        if current is None or not current.status.active:
            return current
        if current.status is MoveStatus.CANCELLING:
            return tasks.finish(handle, MoveStatus.CANCELLED)
        if remaining <= 0:
            return tasks.finish(handle, MoveStatus.COMPLETED)
        try:
            moved, left, received = batch(min(BATCH, rate, remaining))
        except MoveFailed as err:
            return tasks.finish(handle, MoveStatus.FAILED, err.reason)
        tasks.add_moved(handle, moved)
        if received == 0:
            return tasks.finish(handle, MoveStatus.COMPLETED)
        remaining, done = remaining - moved - left, done + moved + left
        if wait(pause_s(done, rate, clock.monotonic() - started)):
            return None


# -- the actions ---------------------------------------------------------------------------
def _not_found(what: str) -> SqsError:
    return SqsError("ResourceNotFoundException", f"The resource that you specified for the "
                                                 f"{what} parameter doesn't exist.", 404)


def _existing(t: Target, arn: Any, parameter: str) -> QueueId:
    """The queue ``arn`` names. Raises ResourceNotFoundException when it names none."""
    try:
        queue = t.from_arn(arn)
        t.info(queue)
        return queue
    except SqsError:
        raise _not_found(parameter) from None


def start_message_move_task(api, t: Target, p: dict) -> dict:
    source = _existing(t, p.get("SourceArn"), "SourceArn")
    if not queues.dead_letter_sources(api, t, source):
        raise invalid("Source queue must be configured as a Dead Letter Queue.")
    destination = p.get("DestinationArn")
    if destination is not None:
        _existing(t, destination, "DestinationArn")
    elif t.own_dead_letters(source):  # rayq's own <name>-dlq: back to <name>
        destination = source.source().arn()
    rate = p.get("MaxNumberOfMessagesPerSecond")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)
                             or not 1 <= rate <= MAX_RATE_PER_S):
        raise invalid(f"MaxNumberOfMessagesPerSecond must be between 1 and {MAX_RATE_PER_S}.")
    source_arn = source.arn()  # one spelling, whichever account segment the caller used
    task = MoveTask(new_handle(source_arn), t.caller.account, t.region, source_arn,
                    destination, rate, t.queue(source).counts_by_visibility()[0],
                    int(api.clock() * 1000))
    if not api.state.move_start(task):
        raise invalid("There is already a task running. Only one active task is allowed "
                      "for a source queue arn at a given time.")
    return {"TaskHandle": task.handle}


def list_message_move_tasks(api, t: Target, p: dict) -> dict:
    source = _existing(t, p.get("SourceArn"), "SourceArn")
    limit = p.get("MaxResults", 1)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= KEPT_TASKS:
        raise invalid(f"MaxResults must be between 1 and {KEPT_TASKS}.")
    return {"Results": [task.entry() for task in api.state.move_list(source.arn())][:limit]}


def cancel_message_move_task(api, t: Target, p: dict) -> dict:
    handle = p.get("TaskHandle")
    _existing(t, handle_source(handle), "SourceArn")
    cancelled = api.state.move_cancel(handle)
    if cancelled is None:
        raise SqsError("ResourceNotFoundException", "Task does not exist.", 404)
    return {"ApproximateNumberOfMessagesMoved": cancelled.moved}


ACTIONS = {"StartMessageMoveTask": start_message_move_task,
           "ListMessageMoveTasks": list_message_move_tasks,
           "CancelMessageMoveTask": cancel_message_move_task}
