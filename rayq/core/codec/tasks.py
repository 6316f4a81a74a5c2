"""Tasks: the call a message carries, the outcome a consumer records, usage reports.

A task message's body is a msgpack ``[args, kwargs]``; its outcome (the
handler's return value, or its exception's type and message) is msgpack too.
Nothing here is ever unpickled: arguments and results cross the queue as data.
"""

from __future__ import annotations

import bisect
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rayq.core.codec.model import check_count, check_name, decode_body, encode_body, pack, unpack
from rayq.errors import InvalidMessage, TaskError

_MSGPACK_TYPES = "None, bool, int, float, str, bytes, and lists and dicts of them"


class Outcome(Enum):
    """How a delivery of a task ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"          # the handler raised; the message will be delivered again
    DEAD = "dead"              # failed for the last time: the message is dead-lettered
    DEFERRED = "deferred"      # not run (see DeferralCause); put back for later


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


def encode_call(type_: str, args: tuple, kwargs: dict, max_bytes: int) -> bytes:
    """The body of a task message. Raises InvalidMessage when an argument is not
    a msgpack-able value, MessageTooLarge over ``max_bytes``."""
    if not all(isinstance(k, str) for k in kwargs):
        raise InvalidMessage(f"keyword argument names of task {type_!r} must be str")
    try:
        return encode_body([list(args), kwargs], max_bytes)
    except InvalidMessage as err:
        if type(err) is not InvalidMessage:
            raise
        raise InvalidMessage(f"arguments of task {type_!r} must be msgpack-able values "
                             f"({_MSGPACK_TYPES}): {err}") from err


def decode_call(body: bytes) -> tuple[list, dict]:
    """``(args, kwargs)`` of a task message. Raises InvalidMessage for any other body."""
    call = decode_body(body)
    if (not isinstance(call, list) or len(call) != 2 or not isinstance(call[0], list)
            or not isinstance(call[1], dict)):
        raise InvalidMessage("message body is not a rayq task call")
    return call[0], call[1]


def encode_result(value: Any, type_: str) -> bytes:
    """A successful outcome. Raises InvalidMessage when the value is not msgpack-able."""
    try:
        packed = pack([True, value])
        unpack(packed)
    except (TypeError, ValueError, OverflowError, InvalidMessage) as err:
        raise InvalidMessage(f"task {type_!r} returned a value that is not msgpack-able "
                             f"({_MSGPACK_TYPES}): {type(value).__name__}") from err
    return packed


def encode_error(error_type: str, error_message: str) -> bytes:
    """A failed outcome: the exception's type name and message."""
    return pack([False, [str(error_type), str(error_message)[:10_000]]])


def error_of(err: BaseException) -> bytes:
    return encode_error(type(err).__name__, str(err))


def decode_outcome(data: bytes) -> Any:
    """The handler's return value; raises TaskError for a failed task."""
    ok, value = unpack(data)
    if ok:
        return value
    raise TaskError(*value)


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


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0..100) of sorted values; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class TallyRow:
    """Per (tenant, type): finished deliveries by outcome, usage and wait percentiles."""

    tenant: str
    type: str
    succeeded: int
    failed: int
    dead: int
    deferred: int
    usage_s: float
    wait_p50_s: float
    wait_p99_s: float
    deferred_by_cause: Mapping[str, int] = field(default_factory=dict)  # cause -> count


def _cause_column(cause: DeferralCause) -> str:
    return f"deferred:{cause.value}"


_COUNTED = [o.value for o in Outcome] + ["usage_s"] + [_cause_column(c) for c in DeferralCause]


class Tally:
    """Counts per (tenant, type) with a bounded reservoir of wait samples."""

    def __init__(self, samples: int = 4096, seed: int = 0):
        self._counts: dict[tuple[str, str], dict[str, float]] = {}
        self._waits: dict[tuple[str, str], list[float]] = {}
        self._seen: dict[tuple[str, str], int] = {}
        self._samples, self._rng = samples, random.Random(seed)

    def add(self, report: UsageReport) -> None:
        who = (report.tenant, report.type)
        counts = self._counts.setdefault(who, dict.fromkeys(_COUNTED, 0.0))
        counts[report.outcome.value] += 1
        if report.outcome is Outcome.DEFERRED:
            counts[_cause_column(report.cause or DeferralCause.CONCURRENCY)] += 1
        counts["usage_s"] += report.usage_s
        if report.outcome is not Outcome.DEFERRED:
            self._sample(who, report.wait_s)

    def _sample(self, who: tuple[str, str], wait_s: float) -> None:
        waits = self._waits.setdefault(who, [])
        seen = self._seen[who] = self._seen.get(who, 0) + 1
        if len(waits) < self._samples:
            bisect.insort(waits, wait_s)
        elif (slot := self._rng.randrange(seen)) < self._samples:  # reservoir sampling
            del waits[slot]
            bisect.insort(waits, wait_s)

    def rows(self, by: str | None = None) -> list[TallyRow]:
        """One row per (tenant, type), or per tenant (``by="tenant"``) or type (``"type"``);
        a grouped row has ``"*"`` in the other field."""
        if by not in (None, "tenant", "type"):
            raise InvalidMessage(f"rows(by=) takes None, 'tenant' or 'type', not {by!r}")
        groups: dict[tuple[str, str], tuple[dict, list[float]]] = {}
        for (tenant, type_), counts in self._counts.items():
            group = (tenant if by != "type" else "*", type_ if by != "tenant" else "*")
            total, waits = groups.setdefault(group, (dict.fromkeys(counts, 0.0), []))
            for name, n in counts.items():
                total[name] += n
            waits.extend(self._waits.get((tenant, type_), []))
        out = []
        for (tenant, type_), (c, waits) in sorted(groups.items()):
            waits.sort()
            out.append(TallyRow(tenant, type_, int(c["succeeded"]), int(c["failed"]),
                                int(c["dead"]), int(c["deferred"]), c["usage_s"],
                                percentile(waits, 50), percentile(waits, 99),
                                {cause.value: int(c[_cause_column(cause)])
                                 for cause in DeferralCause if c[_cause_column(cause)]}))
        return out


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


class TaskFunction:
    """A function registered as a job type by :func:`task`. Calling it runs it here;
    ``client.submit(fn, ...)`` runs it on the runtime's consumers."""

    def __init__(self, fn, spec: TaskSpec):
        if not callable(fn):
            raise InvalidMessage(f"@rayq.task decorates a function, not {fn!r}")
        self.fn, self.spec = fn, spec
        self.__name__ = getattr(fn, "__name__", spec.type)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<rayq task {self.spec.type!r} on queue {self.spec.queue!r}>"


def task(fn=None, *, type: str | None = None, queue: str = "tasks",
         concurrency: int | None = None, max_receives: int = 5,
         num_cpus: float | None = None, num_gpus: float | None = None,
         memory: int | None = None, resources: dict[str, float] | None = None,
         runtime_env: dict[str, Any] | None = None):
    """Register a function as a job type: ``@rayq.task(type="report")``.

    ``type`` defaults to the function's name; ``queue`` is the queue that
    carries it (created on first use with this ``max_receives``);
    ``concurrency`` caps how many run at once cluster-wide; a task that fails
    ``max_receives`` times (or the queue's limit, if lower) ends in ``<queue>-dlq``.

    With none of ``num_cpus``, ``num_gpus``, ``memory`` (bytes), ``resources`` (custom
    resource name -> amount) and ``runtime_env`` set, handlers run on the consumers'
    threads and must be importable where consumers run (or defined in ``__main__``).
    With any of them set, each call runs as a Ray task with these options, on a node
    that has the resources, in that runtime environment (``num_cpus`` defaults to 1,
    Ray's default for a task): see docs/ray-jobs.md, "Where handlers run".
    Raises InvalidMessage for a bad value.
    """
    def wrap(f):
        return TaskFunction(f, TaskSpec(type or getattr(f, "__name__", ""), queue,
                                        concurrency, max_receives, num_cpus, num_gpus,
                                        memory, resources, runtime_env))
    return wrap(fn) if fn is not None else wrap
