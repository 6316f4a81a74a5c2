"""Schedules: task calls the runtime submits by itself, every ``every_s`` seconds or at
the times of a cron expression, kept per account in the manager's control store
(docs/tasks.md, "Schedules").

Pure: the manager (``actors/manager.py``) asks a few times a second which schedules are
due, submits each one's call under its tick's task id, and records the firing here.

- **Ticks.** An ``every_s`` schedule ticks at the multiples of ``every_s`` since the
  epoch, counted in whole milliseconds (``every_s=3600``: on the hour, UTC); a cron
  schedule at the times its five fields name, read in UTC. The first tick is the first
  after the schedule was made (or made again: a schedule made under a name it already
  has replaces the old one).
- **One firing per tick.** A tick's task goes by the id ``<name>@<tick, UTC>``
  (:func:`tick_id`), so submitting it again (the manager stopped between the submit and
  its record) stores and runs nothing: chosen task ids are idempotent.
- **Catch-up: one.** However many ticks passed unfired (the runtime was down, its
  manager failed over), the schedule fires once, under the id of the first tick missed,
  and its next tick is the first after now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from croniter import CroniterError, croniter

from rayq.core.auth.accounts import ADMIN
from rayq.core.codec.model import check_name, fairness_key, pack, unpack
from rayq.core.codec.tasks import MAX_TASK_BYTES, decode_call, with_call_id
from rayq.core.codec.wire import Attrs
from rayq.core.kit.kv import KV
from rayq.errors import AuthError, InvalidMessage

MIN_EVERY_S = 0.001               # ticks are counted in milliseconds
MAX_EVERY_S = 366 * 86400.0       # a year
CRON_FIELDS = 5                   # minute hour day-of-month month day-of-week
MAX_NAME_BYTES = 200              # a record's key holds account and name (LMDB: 511 bytes)
MAX_CALL_BYTES = 256 * 1024       # a call's arguments, kept in the replicated control store
RETRY_S = 1.0                     # a schedule whose firing failed waits this long to fire again
_RECORD = b"schedule:"            # account/name -> the schedule's record
_FIRING = b"schedules-firing"     # the task ids of the firing under way


@dataclass(frozen=True)
class Cadence:
    """When a schedule ticks: every ``every_s`` seconds, or at the times of ``cron``
    (five fields, UTC); exactly one of them. Raises InvalidMessage otherwise."""

    every_s: float | None = None
    cron: str | None = None

    def __post_init__(self):
        if (self.every_s is None) == (self.cron is None):
            raise InvalidMessage("a schedule takes exactly one of every_s and cron")
        if self.every_s is not None:
            every = self.every_s
            if (isinstance(every, bool) or not isinstance(every, (int, float))
                    or not MIN_EVERY_S <= every <= MAX_EVERY_S):
                raise InvalidMessage(f"every_s must be seconds from {MIN_EVERY_S} to "
                                     f"{MAX_EVERY_S:g}, got {every!r:.80}")
            object.__setattr__(self, "every_s", float(every))
        else:
            check_cron(self.cron)

    def next_after(self, t: float) -> float:
        """The first tick after ``t`` (seconds since the epoch)."""
        if self.every_s is not None:
            every_ms = round(self.every_s * 1000)
            return (math.floor(t * 1000) // every_ms + 1) * every_ms / 1000
        return _cron_next(self.cron, t)


def check_cron(cron: Any) -> str:
    """A cron expression of five fields that names times that come. Raises
    InvalidMessage."""
    if not isinstance(cron, str) or len(cron.split()) != CRON_FIELDS \
            or not croniter.is_valid(cron):
        raise InvalidMessage(f"cron takes an expression of {CRON_FIELDS} fields (minute hour "
                             f"day-of-month month day-of-week), got {cron!r:.80}")
    _cron_next(cron, 0.0)  # "0 0 30 2 *" is well formed and never comes
    return cron


def _cron_next(cron: str, t: float) -> float:
    try:
        return croniter(cron, datetime.fromtimestamp(t, timezone.utc)).get_next(float)
    except (CroniterError, ValueError, OverflowError) as err:
        raise InvalidMessage(f"cron {cron!r:.80} names no time to come: {err}") from err


def tick_id(name: str, tick: float) -> str:
    """The task id of schedule ``name``'s tick at ``tick`` (seconds since the epoch):
    ``name@2026-11-28T01:00:00Z``, with milliseconds when the tick has any."""
    seconds, ms = divmod(round(tick * 1000), 1000)
    at = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{name}@{at}{f'.{ms:03d}' if ms else ''}Z"


def check_schedule_name(name: Any) -> str:
    """A schedule's name: a checked name (printable, up to 128 characters) of at most
    MAX_NAME_BYTES in UTF-8. Raises InvalidMessage."""
    check_name(name, "schedule name")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidMessage(f"a schedule name is at most {MAX_NAME_BYTES} bytes in UTF-8")
    return name


def tenant_of(account: str, tenant: str | None) -> str:
    """The tenant a schedule of ``account`` submits as: ``tenant``, by default the
    account. Raises AuthError when an account other than the admin names another,
    as its own submits would."""
    tenant = account if tenant is None else check_name(tenant, "tenant")
    if account != ADMIN and tenant != account:
        raise AuthError(f"account {account!r} submits tasks only as tenant {account!r}")
    return tenant


@dataclass(frozen=True)
class Schedule:
    """A schedule as ``client.schedules()`` shows it. Times are seconds since the epoch:
    ``next_at`` the next tick, ``last_fired_at`` the last tick fired (None before the
    first); ``args`` and ``kwargs`` as stored. Exactly one of ``every_s`` and ``cron``."""

    name: str
    type: str
    tenant: str
    every_s: float | None
    cron: str | None
    next_at: float
    last_fired_at: float | None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def last_task_id(self) -> str | None:
        """The id of the task the last firing submitted (None before the first)."""
        return None if self.last_fired_at is None else tick_id(self.name, self.last_fired_at)


@dataclass(frozen=True)
class Planned:
    """A schedule as the manager keeps it: whose it is (``account``), what it calls
    (``call``: the body :func:`~rayq.core.codec.tasks.encode_call` made) and when it
    fires next (``next_at``)."""

    account: str
    name: str
    type: str
    tenant: str
    cadence: Cadence
    call: bytes
    next_at: float
    last_fired_at: float | None = None

    @classmethod
    def made(cls, account: str, name: str, type_: str, tenant: str | None, cadence: Cadence,
             call: bytes, now: float) -> "Planned":
        """A new schedule of ``account`` made at ``now``, every field checked. Raises
        InvalidMessage, or AuthError for another account's tenant."""
        check_schedule_name(name)
        check_name(type_, "task type")
        if not isinstance(cadence, Cadence):
            raise InvalidMessage("a schedule takes a Cadence")
        if not isinstance(call, bytes) or len(call) > MAX_CALL_BYTES:
            raise InvalidMessage(f"a schedule's arguments are at most {MAX_CALL_BYTES} bytes "
                                 f"encoded")
        decode_call(call)  # a task call, or InvalidMessage
        return cls(account, name, type_, tenant_of(account, tenant), cadence, call,
                   cadence.next_after(now))

    @property
    def key(self) -> bytes:
        return record_key(self.account, self.name)

    @property
    def task_id(self) -> str:
        """The id its next firing submits under."""
        return tick_id(self.name, self.next_at)

    def due(self, now: float) -> bool:
        return self.next_at <= now

    def fired(self, now: float) -> "Planned":
        """The schedule once its due tick fired at ``now``: one firing for every tick
        missed until now, the next tick the first after now."""
        return replace(self, last_fired_at=self.next_at,
                       next_at=self.cadence.next_after(max(now, self.next_at)))

    def entry(self, key_mode: str) -> tuple[Attrs, bytes, str]:
        """Its next firing's task as a put entry (:func:`rayq.core.codec.wire.encode_put`),
        keyed for fairness by ``key_mode`` as a submit is."""
        return (Attrs(self.tenant, self.type, fairness_key(self.tenant, self.type, key_mode),
                      task=True), with_call_id(self.call, self.task_id, MAX_TASK_BYTES),
                self.task_id)

    def view(self) -> Schedule:
        args, kwargs = decode_call(self.call)
        return Schedule(self.name, self.type, self.tenant, self.cadence.every_s,
                        self.cadence.cron, self.next_at, self.last_fired_at, tuple(args), kwargs)

    def to_record(self) -> bytes:
        return pack([self.account, self.name, self.type, self.tenant, self.cadence.every_s,
                     self.cadence.cron, self.call, self.next_at, self.last_fired_at])

    @classmethod
    def from_record(cls, data: bytes) -> "Planned":
        account, name, type_, tenant, every_s, cron, call, next_at, last = unpack(data)
        return cls(account, name, type_, tenant, Cadence(every_s, cron), call, next_at, last)


def record_key(account: str, name: str) -> bytes:
    """A schedule's key: account names hold no ``/``, so the first one ends the account."""
    return _RECORD + f"{account}/{name}".encode("utf-8", "surrogatepass")


class ScheduleBook:
    """Every account's schedules, persisted in a KV's ``meta`` table (the manager's
    replicated control store) and kept in memory; a firing that failed waits
    RETRY_S (in memory: a restart tries at once)."""

    def __init__(self, kv: KV):
        self.kv = kv
        self._planned: dict[bytes, Planned] = kv.read(self._load)
        self._held: dict[bytes, float] = {}  # key -> when a failed firing may try again

    @staticmethod
    def _load(txn) -> dict[bytes, Planned]:
        return {key: Planned.from_record(value)
                for key, value in txn.scan("meta", _RECORD, _RECORD[:-1] + b";")}

    def put(self, planned: Planned) -> Planned:
        """Add ``planned``, replacing the account's schedule of the same name."""
        self.kv.transact(lambda txn: txn.put("meta", planned.key, planned.to_record()))
        self._planned[planned.key] = planned
        self._held.pop(planned.key, None)
        return planned

    def remove(self, account: str, name: str) -> bool:
        """Remove the account's schedule ``name``; whether there was one."""
        key = record_key(account, check_schedule_name(name))
        if key not in self._planned:
            return False
        self.kv.transact(lambda txn: txn.delete("meta", key))
        del self._planned[key]
        self._held.pop(key, None)
        return True

    def of(self, account: str) -> list[Planned]:
        """The account's schedules, by name."""
        return sorted((p for p in self._planned.values() if p.account == account),
                      key=lambda p: p.name)

    def due(self, now: float) -> list[Planned]:
        """The schedules with a tick due at ``now`` (not those waiting after a failure)."""
        return [p for key, p in self._planned.items()
                if p.due(now) and self._held.get(key, 0.0) <= now]

    def firing(self, due: Iterable[Planned]) -> None:
        """Record the task ids about to be submitted. The write goes to every copy of the
        control store first: a manager a newer epoch replaced raises StaleEpoch here and
        submits nothing."""
        ids = pack([p.task_id for p in due])
        self.kv.transact(lambda txn: txn.put("meta", _FIRING, ids))

    def fired(self, done: Iterable[Planned], now: float) -> list[Planned]:
        """Record that the due ticks of ``done`` were submitted at ``now``, in one
        transaction; a schedule replaced or removed meanwhile keeps its new state. The
        schedules as they are now."""
        current = [p for p in done if self._planned.get(p.key) == p]
        after = [p.fired(now) for p in current]

        def write(txn):
            for p in after:
                txn.put("meta", p.key, p.to_record())
            txn.delete("meta", _FIRING)
        self.kv.transact(write)
        for p in after:
            self._planned[p.key] = p
            self._held.pop(p.key, None)
        return after

    def hold(self, failed: Iterable[Planned], until: float) -> None:
        """Fire none of ``failed`` before ``until`` (their firing failed)."""
        for p in failed:
            self._held[p.key] = until
