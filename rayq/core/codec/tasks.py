"""Tasks: the call a message carries, the outcome a consumer records, usage reports.

A task message's body is ``[args, kwargs]`` and its outcome ``[True, value]`` (or
``[False, [error type, message]]``), encoded by :mod:`rayq.core.codec.values`: plain
msgpack when they are plain msgpack values, a values body otherwise, which carries
tuples, numpy arrays and scalars, pyarrow Tables and RecordBatches, pandas DataFrames,
datetime, date, timedelta, Decimal and UUID, each given back as the same type with the
same value (docs/tasks.md#values). Nothing here is ever unpickled: arguments and
results cross the queue as data. Any other value is refused with InvalidMessage naming
its type; a body or result over ``StoreConfig.max_task_bytes`` with MessageTooLarge.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rayq.config import StoreConfig
from rayq.core.codec.model import PACKED_TAG, check_count, check_name, pack, unpack
from rayq.core.codec.values import VALUES_TAG, Resolve, decode_value, encode_value
from rayq.errors import InvalidMessage, MessageTooLarge, TaskCancelled, TaskError, TaskTimedOut

_MSGPACK_TYPES = "None, bool, int, float, str, bytes, and lists and dicts of them"
_PLAIN_CALL = bytes([PACKED_TAG])  # a call of plain msgpack values is a packed body
MAX_TASK_BYTES = StoreConfig.max_task_bytes  # the default limit of a result


class Outcome(Enum):
    """How a delivery of a task ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"          # the handler raised; the message will be delivered again
    DEAD = "dead"              # failed for the last time: the message is dead-lettered
    DEFERRED = "deferred"      # not run (see DeferralCause); put back for later
    CANCELLED = "cancelled"    # withdrawn by client.cancel while it ran: no failure


class DeferralCause(Enum):
    """Why a consumer put a received task back unrun. Each counts as a deferral of
    the task's key (docs/fairness-coordinator.md: so a key held back is not taken for a
    usage victim)."""

    CONCURRENCY = "concurrency"      # its type was at its concurrency limit
    HOST_PRESSURE = "host_pressure"  # the consumer's host was over its memory or CPU limit
    SUSPENDED = "suspended"          # its key was suspended after it was received
    CANNOT_RUN = "cannot_run"        # no handler is registered for its type


@dataclass(frozen=True)
class TaskSpec:
    """A registered job type: which queue carries it, how many may run at once and,
    when any of ``num_cpus``, ``num_gpus``, ``memory`` (bytes), ``resources`` or
    ``runtime_env`` is set, what its handler asks of Ray: each call then runs as a
    Ray task with those options (:mod:`rayq.core.control.ray_tasks`).

    Its retry rule: a failed call is retried, up to ``max_receives`` deliveries, unless
    the exception is one of ``no_retry_on``, or ``retry_on`` is set and it is none of
    them (exception classes by qualified name, ``module.Qualname``; a class counts for
    its bases too). Retries wait ``backoff_s`` doubling up to ``max_backoff_s`` (the
    consumers' settings when None), with ``jitter`` drawn in the upper half of each wait.

    ``time_limit_s`` (None: none) stops a call that runs longer, which then fails with
    TaskTimedOut; ``cancel_grace_s`` is how long a cancelled (or timed out) handler
    has to return before it is stopped by force (docs/tasks.md, "Cancel and time limits").

    Raises InvalidMessage for a bad field. ``runtime_env`` is kept as msgpack gives
    it back (tuples become lists), so a spec read back from the registry equals it.
    """

    type: str
    queue: str
    concurrency: int | None = None
    max_receives: int = 5
    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None          # bytes
    resources: dict[str, float] | None = field(default=None, hash=False)
    runtime_env: dict[str, Any] | None = field(default=None, hash=False)
    retry_on: tuple[str, ...] | None = None
    no_retry_on: tuple[str, ...] = ()
    backoff_s: float | None = None
    max_backoff_s: float | None = None
    jitter: bool = True
    time_limit_s: float | None = None
    cancel_grace_s: float = 10.0

    def __post_init__(self):
        check_name(self.type, "task type")
        check_name(self.queue, "task queue")
        if self.concurrency is not None:
            check_count(self.concurrency, "concurrency", 1, 1_000_000)
        check_count(self.max_receives, "max_receives", 1, 1000)
        for name in ("num_cpus", "num_gpus"):
            if getattr(self, name) is not None:
                check_amount(getattr(self, name), name)
        if self.memory is not None:
            check_count(self.memory, "memory (bytes)", 0, 2**63 - 1)
        if self.resources is not None:
            object.__setattr__(self, "resources", check_resources(self.resources))
        if self.runtime_env is not None:
            object.__setattr__(self, "runtime_env", check_runtime_env(self.runtime_env))
        if self.retry_on is not None:
            object.__setattr__(self, "retry_on", exception_names(self.retry_on, "retry_on"))
        object.__setattr__(self, "no_retry_on", exception_names(self.no_retry_on, "no_retry_on"))
        for name in ("backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value <= MAX_BACKOFF_S):
                raise InvalidMessage(f"{name} must be seconds from 0 to {MAX_BACKOFF_S:g}, "
                                     f"got {value!r}")
        if not isinstance(self.jitter, bool):
            raise InvalidMessage(f"jitter must be True or False, got {self.jitter!r}")
        if self.time_limit_s is not None:
            check_limit_s(self.time_limit_s, "time_limit_s")
        check_limit_s(self.cancel_grace_s, "cancel_grace_s", least=0.0)


MAX_BACKOFF_S = 12 * 3600.0  # an SQS visibility timeout's limit: a retry waits in the queue
MAX_TIME_LIMIT_S = 7 * 24 * 3600.0  # a week: past that a limit guards nothing


def check_limit_s(value: Any, what: str, least: float | None = None) -> float:
    """Seconds of a time limit or grace: above 0 (at least ``least`` when given) and at
    most MAX_TIME_LIMIT_S. Raises InvalidMessage."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not ((value >= least) if least is not None else (value > 0)) \
            or value > MAX_TIME_LIMIT_S:
        bound = f"at least {least:g}" if least is not None else "above 0"
        raise InvalidMessage(f"{what} must be seconds {bound} and at most "
                             f"{MAX_TIME_LIMIT_S:g}, got {value!r}")
    return float(value)


def task_time_limit_s(spec: TaskSpec, asked_s: float | None) -> float | None:
    """The time limit of one call: its type's, lowered to ``asked_s`` (``submit``'s
    ``time_limit_s``). A call may only lower its type's limit: InvalidMessage above it."""
    if asked_s is None:
        return spec.time_limit_s
    check_limit_s(asked_s, "time_limit_s")
    if spec.time_limit_s is not None and asked_s > spec.time_limit_s:
        raise InvalidMessage(f"time_limit_s={asked_s:g} is above the limit of task type "
                             f"{spec.type!r} ({spec.time_limit_s:g} s): a call may only lower it")
    return float(asked_s)


def exception_name(cls: type) -> str:
    """How a retry rule names an exception class: ``module.Qualname``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def exception_names(classes: Any, what: str) -> tuple[str, ...]:
    """``classes`` (exception classes, or their names as :func:`exception_name` gives
    them) as names; InvalidMessage for anything else."""
    if isinstance(classes, (str, type)):
        classes = (classes,)
    if not isinstance(classes, (tuple, list)):
        raise InvalidMessage(f"{what} takes exception classes, got {classes!r:.80}")
    names = []
    for c in classes:
        if isinstance(c, type) and issubclass(c, BaseException):
            names.append(exception_name(c))
        elif isinstance(c, str) and c:
            names.append(c)
        else:
            raise InvalidMessage(f"{what} takes exception classes, got {c!r:.80}")
    return tuple(names)


# Ray takes these as num_cpus=, num_gpus= and memory=, not in resources=.
_RESOURCE_KEYWORDS = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
_FINEST_AMOUNT = 0.0001  # Ray keeps resource amounts to four decimal places


def check_amount(value: Any, what: str) -> float:
    """A Ray resource amount: a finite number >= 0, 0 or at least 0.0001."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 <= value < float("inf")):
        raise InvalidMessage(f"{what} must be a number >= 0, got {value!r}")
    if 0 < value < _FINEST_AMOUNT:
        raise InvalidMessage(f"{what} must be 0 or at least {_FINEST_AMOUNT}, got {value!r}")
    return value


def check_resources(resources: Any) -> dict[str, float]:
    """Ray custom resources: a dict of resource name -> amount (see check_amount)."""
    if not isinstance(resources, dict):
        raise InvalidMessage(f"resources must be a dict of name -> amount, got {resources!r}")
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise InvalidMessage(f"resource names must be non-empty str, got {name!r}")
        if name in _RESOURCE_KEYWORDS:
            raise InvalidMessage(f"ask for {name!r} with {_RESOURCE_KEYWORDS[name]}=, "
                                 f"not in resources")
        check_amount(amount, f"resource {name!r}")
    return {name: float(amount) for name, amount in resources.items()}


def check_runtime_env(runtime_env: Any) -> dict[str, Any]:
    """A Ray runtime environment as a dict of msgpack-able values with str keys,
    as msgpack gives it back; a ``working_dir`` is a URI or an absolute path (Ray
    checks the rest when the consumer first launches the type's Ray task)."""
    if not isinstance(runtime_env, dict) or not all(isinstance(k, str) for k in runtime_env):
        raise InvalidMessage(f"runtime_env must be a dict with str keys, got {runtime_env!r}")
    try:
        env = unpack(pack(runtime_env))
    except (TypeError, ValueError, OverflowError, InvalidMessage) as err:
        raise InvalidMessage(f"runtime_env must hold msgpack-able values "
                             f"({_MSGPACK_TYPES}): {err}") from err
    working_dir = env.get("working_dir")
    if working_dir is not None and not (isinstance(working_dir, str) and (
            "://" in working_dir or os.path.isabs(working_dir))):
        raise InvalidMessage(f"runtime_env working_dir must be a URI or an absolute path, "
                             f"got {working_dir!r}")
    return env


def encode_call(type_: str, args: tuple, kwargs: dict, max_bytes: int,
                task_id: str | None = None, time_limit_s: float | None = None,
                resolve: Resolve | None = None) -> bytes:
    """The body of a task message: ``[args, kwargs]``, and a third element, the call's
    options, when it has any: ``{"id": task_id, "time_limit_s": s}`` (the id its handler
    sees in ``rayq.current_task()``; a limit only when the call lowered its type's).
    ``resolve(v)``: the value to send in place of ``v``, a value of no type carried (an
    ObjectRef, read), or ``v`` itself. Raises InvalidMessage naming the first argument's
    type that cannot go, MessageTooLarge over ``max_bytes``."""
    if not all(isinstance(k, str) for k in kwargs):
        raise InvalidMessage(f"keyword argument names of task {type_!r} must be str")
    call: list = [list(args), kwargs]
    options = {name: value for name, value in (("id", task_id), ("time_limit_s", time_limit_s))
               if value is not None}
    if options:
        call.append(options)
    try:
        return encode_value(call, max_bytes, resolve, _PLAIN_CALL)
    except InvalidMessage as err:
        if type(err) is not InvalidMessage:
            raise
        raise InvalidMessage(f"arguments of task {type_!r} cannot go (they must be msgpack-able "
                             f"values or other values rayq carries): {err}") from err


def with_call_id(body: bytes, task_id: str, max_bytes: int) -> bytes:
    """Task message ``body`` with its id among its options (a call stored before it had
    one, e.g. a schedule's, fired under its tick's id)."""
    args, kwargs, options = decode_call_options(body)
    return encode_value([args, kwargs, {**options, "id": task_id}], max_bytes, None,
                        _PLAIN_CALL)


def decode_call(body: bytes) -> tuple[list, dict]:
    """``(args, kwargs)`` of a task message. Raises InvalidMessage for any other body."""
    args, kwargs, _ = decode_call_options(body)
    return args, kwargs


def decode_call_options(body: bytes) -> tuple[list, dict, dict]:
    """``(args, kwargs, options)`` of a task message (options: ``{}`` when the call set
    none). Raises InvalidMessage for any other body."""
    if body[:1] not in (_PLAIN_CALL, bytes([VALUES_TAG])):
        raise InvalidMessage("message body is not a rayq task call")
    call = decode_value(body, 1)
    if (not isinstance(call, list) or len(call) not in (2, 3) or not isinstance(call[0], list)
            or not isinstance(call[1], dict)
            or (len(call) == 3 and not isinstance(call[2], dict))):
        raise InvalidMessage("message body is not a rayq task call")
    return call[0], call[1], call[2] if len(call) == 3 else {}


def encode_result(value: Any, type_: str, max_bytes: int = MAX_TASK_BYTES) -> bytes:
    """A successful outcome. Raises InvalidMessage when the value cannot go (the message
    names its type), MessageTooLarge when its encoding is over ``max_bytes``."""
    try:
        return encode_value([True, value], max_bytes)
    except MessageTooLarge as err:
        raise MessageTooLarge(f"task {type_!r} returned a value too large to keep: "
                              f"{err}") from err
    except InvalidMessage as err:
        raise InvalidMessage(f"task {type_!r} returned a value that is not msgpack-able "
                             f"nor another value rayq carries: {err}") from err


def encode_error(error_type: str, error_message: str) -> bytes:
    """A failed outcome: the exception's type name and message."""
    return pack([False, [str(error_type), str(error_message)[:10_000]]])


def error_of(err: BaseException) -> bytes:
    return encode_error(type(err).__name__, str(err))


# Failed outcomes whose error type names one of rayq's own task errors raise that class.
_TASK_ERRORS = {"TaskCancelled": TaskCancelled, "TaskTimedOut": TaskTimedOut}


def decode_outcome(data: bytes) -> Any:
    """The handler's return value; raises TaskError for a failed task (TaskTimedOut for
    one stopped at its time limit)."""
    ok, value = decode_value(data)
    if ok:
        return value
    raise _TASK_ERRORS.get(value[0], TaskError)(*value)


def outcome_succeeded(data: bytes) -> bool:
    """Whether an encoded outcome is a value (not an error), read from its first bytes:
    the value is not decoded."""
    at = 1 if data[:1] != bytes([VALUES_TAG]) else 6  # past a values body's head
    return data[at:at + 1] == b"\xc3"  # msgpack's True, after the outcome's array header


@dataclass(frozen=True)
class UsageReport:
    """What one finished delivery cost: reported by consumers for every message.

    usage_s: handler wall time; wait_s: from enqueue until the handler started.
    """

    key: str
    tenant: str
    type: str
    usage_s: float
    outcome: Outcome
    wait_s: float
    finished_at: float
    message_id: str = ""
    attempt: int = 1       # the delivery's dequeue count: above 1, it was redelivered
    queue: str = ""
    cause: DeferralCause | None = None  # why, for a deferral

    def pack(self) -> bytes:
        """The report as the shard keeps it with the delivery's end (msgpack)."""
        return pack([self.key, self.tenant, self.type, self.usage_s, self.outcome.value,
                     self.wait_s, self.finished_at, self.message_id, self.attempt, self.queue,
                     None if self.cause is None else self.cause.value])

    @classmethod
    def unpack(cls, data: bytes) -> "UsageReport":
        """A packed report. Raises InvalidMessage for anything else."""
        try:
            (key, tenant, type_, usage_s, outcome, wait_s, finished_at, message_id, attempt,
             queue, cause) = unpack(data)
            return cls(key, tenant, type_, float(usage_s), Outcome(outcome), float(wait_s),
                       float(finished_at), message_id, attempt, queue,
                       None if cause is None else DeferralCause(cause))
        except (TypeError, ValueError) as err:
            raise InvalidMessage(f"not a packed usage report: {err}") from err


def unpacked_reports(packed: list[bytes]) -> tuple[list[UsageReport], int]:
    """The usage reports among ``packed`` and how many were not reports (skipped: one
    malformed report must not stop the others from being counted)."""
    out, bad = [], 0
    for data in packed:
        try:
            out.append(UsageReport.unpack(data))
        except InvalidMessage:
            bad += 1
    return out, bad
