"""The one exception tree of rayq.

Every error a caller can see derives from :class:`RayqError`. Errors caused by
the caller's input or request ("you did it") derive from :class:`UsageError`;
errors of the runtime itself ("it broke", or "not now": a routing change, load
shedding) derive from :class:`RuntimeFailure`, so callers can retry the latter and
fix the former. :class:`TaskError` stands apart: it carries the exception of a
task's own handler, which is neither the caller's input nor rayq's runtime.
"""

from __future__ import annotations


class RayqError(Exception):
    """Raised when anything in rayq fails; catch this to catch them all."""


class UsageError(RayqError):
    """Raised when a call was made with input rayq cannot accept."""


class RuntimeFailure(RayqError):
    """Raised when the runtime could not carry out a valid request."""


class QueueNotFound(UsageError):
    """Raised when a call names a queue that does not exist."""


class QueueExists(UsageError):
    """Raised when a queue is created with settings that conflict with an existing one."""


class ConfigError(UsageError):
    """Raised when a configuration value, section or file is invalid.

    A :class:`UsageError` and not an :class:`InvalidMessage`: the settings are
    wrong, not a message or a call's argument.
    """


class InvalidMessage(UsageError):
    """Raised when a body, attribute or argument is malformed or out of range."""


class MessageTooLarge(InvalidMessage):
    """Raised when an encoded body exceeds ``StoreConfig.max_message_bytes``."""


class ReceiptInvalid(UsageError):
    """Raised when a pop receipt is stale, forged, malformed or already used.

    ``receipts`` holds the offending receipts when a batch call failed for some.
    """

    def __init__(self, message: str, receipts: tuple[str, ...] = ()):
        super().__init__(message)
        self.receipts = receipts


class AuthError(UsageError):
    """Raised when a request is unsigned, forged, expired, replayed or crosses accounts."""


class DataDirExposed(UsageError):
    """Raised when the data directory (or a folder rayq keeps in it) can be read or
    entered by other users: it holds every message and every account key."""


class KeyExposed(UsageError):
    """Raised when a TLS private key handed to the SQS endpoint can be read or written by
    other users, or belongs to another user: whoever reads it can pose as the endpoint."""


class UnknownLayout(UsageError):
    """Raised when a shard's store on disk was written in a row layout this rayq does not
    read (its ``row_format`` record is another, or its rows carry none): open it with the
    rayq that wrote it. Nothing is changed on disk."""


class QuotaExceeded(UsageError):
    """Raised when an account would pass a quota the admin set on it (``Client.set_quota``):
    a queue past its queue quota, or a put past its message or byte quota. Deleting
    queues or messages (or a larger quota) makes room; retrying as is does not."""


class Overloaded(RuntimeFailure):
    """Raised when the runtime sheds load; retry later with back-off."""


class StoreError(RuntimeFailure):
    """Raised when the storage engine fails underneath a valid request."""


class StoreBug(StoreError):
    """Raised when the store's own code failed on a valid request (a bug in rayq).

    The write transaction was aborted, so nothing it did is stored; ``__cause__``
    holds the exception the store raised.
    """


class StaleEpoch(RuntimeFailure):
    """Raised when a shard replica refuses a write or a change made under an epoch older
    than the one it holds durably: a newer leader took over (docs/replication.md).

    The old leader's caller learns its write was not acknowledged; it retries and
    reaches the new leader.
    """


class ReplicaBehind(RuntimeFailure):
    """Raised when a follower is offered write sets past a gap (it missed some): it
    is out of sync and must be seeded again."""


class NotEnoughReplicas(RuntimeFailure):
    """Raised when a shard has fewer in-sync replicas than ``min_in_sync``: the write
    may be stored on the leader but is not acknowledged (retry; at-least-once)."""


class QueueDisabled(RuntimeFailure):
    """Raised when a subqueue (or a whole queue) stopped taking the operation since
    the caller routed to it: it is being drained, retired or removed.

    A routing event, not the caller's mistake: the client routes anew and retries.
    """


class NoEvents(UsageError):
    """Raised when a report is asked for while the event log holds no events yet.

    Nothing broke: run some work (or flush the event log) and ask again.
    """


class TaskNotFound(UsageError):
    """Raised when a task id names no task of the caller's account: never submitted by
    it, or its outcome was kept its time (``outcome_ttl_s``) and is gone; and when a
    redrive names a task type none registered."""


class OutcomeLost(RuntimeFailure):
    """Raised when ``ray.get`` waits on a task of which no copy is left: neither the task
    nor its outcome is stored on any copy of its shard."""


class ResultTimeout(RuntimeFailure, TimeoutError):
    """Raised when ``client.result(task_id, timeout_s)`` waited ``timeout_s`` and the task
    has not ended; the task goes on."""


class TaskError(RayqError):
    """Raised when ``ray.get`` waits on a submitted task whose handler raised.

    ``error_type`` and ``error_message`` carry the handler's exception.
    """

    def __init__(self, error_type: str, error_message: str):
        super().__init__(f"{error_type}: {error_message}")
        self.error_type = error_type
        self.error_message = error_message

    def __reduce__(self):
        return (type(self), (self.error_type, self.error_message))


class TaskCancelled(TaskError):
    """Raised when ``ray.get`` (or ``client.result``) waits on a task that
    ``client.cancel`` withdrew: before it ran, or while it ran (its handler was told, and
    stopped if it did not return within its type's ``cancel_grace_s``)."""

    def __init__(self, error_type: str = "TaskCancelled",
                 error_message: str = "the task was cancelled"):
        super().__init__(error_type, error_message)


class TaskTimedOut(TaskError):
    """Raised when ``ray.get`` waits on a task whose handler ran past its time limit
    (``@rayq.task(time_limit_s=)``, or ``submit(time_limit_s=)``) on its last try, or
    whose type's retry rule does not retry it (``error_type`` "TaskTimedOut")."""

    def __init__(self, error_type: str = "TaskTimedOut",
                 error_message: str = "the task ran past its time limit"):
        super().__init__(error_type, error_message)


class Throttled(UsageError):
    """Raised when a put carries messages of a tenant listed as a flooder and
    ``FloodConfig.flooder_puts`` refuses them: past its rate ("throttle") or at all
    while it is listed ("block"). Nothing of the put is stored; retry later with
    back-off, or send less (SQS's ``RequestThrottled``)."""
