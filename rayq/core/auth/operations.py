"""The signed operations: every runtime call a client may sign, defined once; and beside
them each actor's internal methods, the calls only the runtime makes.

Each entry names the actor method, its parameters (with their defaults, as the method
declares them), what the call touches and who may make it. The client signs the
arguments bound BY NAME from the entry (:meth:`Operation.bind`, :meth:`Operation.body`);
the actor's method carries the same entry (``@signed`` in :mod:`rayq.core.auth.gate`),
which checks at import that the method takes exactly these parameters, and its gate
checks a request from the entry: the signature, the queue it names, the subqueues and
receipts it touches, and whether only the ``default`` account may make it.

Scopes:

- ``ADMIN``: the ``default`` account only; signed for no queue.
- ``ACCOUNT``: any account; signed for the queue its ``queue`` parameter names (or
  none); the actor decides what that account may see of it.
- ``SUBQUEUES``: a shard's data path; signed for a queue, and every subqueue the call
  touches (named in ``subqueues`` parameters, or pointed into by ``receipts``) must be
  one of that queue's on this shard, and the account's to use. What a ``stores``
  parameter carries counts against the queue owner's quota (:mod:`rayq.core.auth.quotas`).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgpack

from rayq.core.codec.model import Receipt
from rayq.errors import AuthError, InvalidMessage, ReceiptInvalid

RESERVED = frozenset({"auth", "caller", "queue", "self"})  # never an operation's parameter


class Binder:
    """``signature.bind(*args, **kwargs)`` with defaults applied, as a dict in parameter
    order: what every signed call does two or three times, so the common case (no
    ``*args``/``**kwargs`` parameter, nothing missing or doubled) skips inspect's
    general binding. Anything else goes to inspect, which raises its TypeError."""

    def __init__(self, signature: inspect.Signature):
        params = list(signature.parameters.values())
        self.signature = signature
        self._plain = all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)
        self._positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        self._names = tuple(signature.parameters)
        self._known = frozenset(self._names)
        self._defaults = {p.name: p.default for p in params if p.default is not p.empty}

    def __call__(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        if self._plain and len(args) <= len(self._positional) and kwargs.keys() <= self._known:
            given = dict(zip(self._positional, args))
            if not given.keys() & kwargs.keys():
                given.update(kwargs)
                if len(given) == len(self._names):
                    return {name: given[name] for name in self._names}
                if all(name in given or name in self._defaults for name in self._names):
                    return {name: given[name] if name in given else self._defaults[name]
                            for name in self._names}
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return dict(bound.arguments)


class Scope(enum.Enum):
    ADMIN = "admin"
    ACCOUNT = "account"
    SUBQUEUES = "subqueues"


@dataclass(frozen=True)
class Operation:
    """One signed operation (see the module docstring). ``name`` is what a signature
    names: ``actor.method``, so a signature made for one actor's method never passes
    at another's. ``queue``: the parameter (``name`` or ``param.attribute``) naming the
    queue an ACCOUNT operation is signed for; empty for none."""

    actor: str
    method: str
    signature: inspect.Signature
    scope: Scope
    subqueues: tuple[str, ...] = ()
    receipts: tuple[str, ...] = ()
    queue: str = ""
    stores: str = ""  # the parameter carrying a put buffer (counted against quotas)

    @property
    def name(self) -> str:
        return f"{self.actor}.{self.method}"

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(self.signature.parameters)

    @property
    def admin_only(self) -> bool:
        return self.scope is Scope.ADMIN

    @functools.cached_property
    def _binder(self) -> Binder:
        return Binder(self.signature)

    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The call's arguments by name, defaults filled in. Raises InvalidMessage for
        arguments the operation does not take."""
        try:
            return self._binder(args, kwargs)
        except TypeError as err:
            raise InvalidMessage(f"{self.name}: {err}") from None

    def body(self, arguments: Mapping[str, Any]) -> bytes:
        """The canonical bytes a signature's digest covers: every parameter, by name, in
        the entry's order. Raises AuthError when an argument cannot be signed."""
        pairs = [[name, arguments[name]] for name in self.params]
        try:
            return msgpack.packb(pairs, default=_plain, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as err:
            raise AuthError(f"the request's arguments cannot be signed: {err}") from err

    def signed_queue(self, arguments: Mapping[str, Any]) -> str:
        """The queue an ACCOUNT or ADMIN operation is signed for (its ``queue``
        parameter's value; "" for none)."""
        if not self.queue:
            return ""
        param, _, attribute = self.queue.partition(".")
        value = arguments[param]
        return getattr(value, attribute, "") if attribute else value

    def touched(self, arguments: Mapping[str, Any]) -> list:
        """The subqueues the call touches, for the gate to check (anything but an
        integer id in the list is refused there). A parameter whose default is None
        touches nothing when None; malformed receipts are left to the store to refuse."""
        out: list = []
        for param in self.subqueues:
            out += _named(arguments[param], self._optional(param))
        for param in self.receipts:
            out += [sq for sq in map(_receipt_subqueue, _named(arguments[param], False))
                    if sq is not None]
        return out

    def _optional(self, param: str) -> bool:
        return self.signature.parameters[param].default is None


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _named(value: Any, optional: bool) -> list:
    """The items a subqueue (or receipt) parameter names."""
    if value is None and optional:
        return []
    return list(value) if _is_list(value) else [value]


def _receipt_subqueue(receipt: Any) -> int | None:
    try:
        return Receipt.decode(receipt).subqueue
    except ReceiptInvalid:
        return None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__name__] + [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot sign an argument of type {type(value).__name__}")


def parameters(spec: str) -> inspect.Signature:
    """A signature from Python's own parameter syntax: ``"a, b=1, *, c=None"``
    (defaults are literals)."""
    params, kind = [], inspect.Parameter.POSITIONAL_OR_KEYWORD
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if item == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        name, eq, default = (part.strip() for part in item.partition("="))
        if name in RESERVED:
            raise ValueError(f"{name!r} is not an operation's parameter")
        params.append(inspect.Parameter(name, kind, default=ast.literal_eval(default) if eq
                                        else inspect.Parameter.empty))
    return inspect.Signature(params)


def _entry(actor: str, method: str, spec: str, scope: Scope, **touches: Any) -> Operation:
    return Operation(actor, method, parameters(spec), scope, **touches)


_A, _S, _ADMIN = Scope.ACCOUNT, Scope.SUBQUEUES, Scope.ADMIN
_RECEIVE = ("subqueue, max_messages=1, visibility_timeout_s=None, *, keys=None, "
            "max_receives=None, dead_letter=None, wait_s=0.0, exclude=None")

OPERATIONS: Mapping[str, Operation] = MappingProxyType({op.name: op for op in (
    # shards: the data path, and the statistics of the whole shard
    _entry("shard", "put", "subqueue, batch", _S, subqueues=("subqueue",), stores="batch"),
    _entry("shard", "receive", _RECEIVE, _S, subqueues=("subqueue", "dead_letter")),
    _entry("shard", "delete", "receipts", _S, receipts=("receipts",)),
    _entry("shard", "change_visibility", "receipt, timeout_s", _S, receipts=("receipt",)),
    _entry("shard", "end_many", "calls", _ADMIN),  # the consumers' batched ends of tasks
    _entry("shard", "clear", "subqueue", _S, subqueues=("subqueue",)),
    _entry("shard", "peek", "subqueue, max_messages=1, *, keys=None", _S, subqueues=("subqueue",)),
    _entry("shard", "counts", "subqueues", _S, subqueues=("subqueues",)),
    _entry("shard", "visibility_counts", "subqueues", _S, subqueues=("subqueues",)),
    _entry("shard", "depths", "subqueues=None", _S, subqueues=("subqueues",)),
    _entry("shard", "tasks", "task_ids", _A),
    _entry("shard", "cancel", "task_id", _A),  # the caller's account's task
    _entry("shard", "stats", "", _ADMIN),
    _entry("shard", "noisy", "", _ADMIN),
    _entry("shard", "flush_events", "", _ADMIN),
    _entry("shard", "redrive", "source, target, limit, *, type_=None, until_us=None, after=None",
           _S, subqueues=("source", "target")),
    # the manager: accounts, queues, routing, task registrations, consumers
    _entry("manager", "whoami", "", _A),
    _entry("manager", "create_account", "name", _ADMIN),
    _entry("manager", "rotate_key", "account, slot", _ADMIN),
    _entry("manager", "set_quota", "account, queues=None, messages=None, bytes=None", _ADMIN),
    _entry("manager", "create_queue", "name, subqueues=1, max_receives=5, ordered=False", _A,
           queue="name"),
    _entry("manager", "list_queues", "", _A),
    _entry("manager", "delete_queue", "name", _A, queue="name"),
    _entry("manager", "clear_queue", "name", _A, queue="name"),
    _entry("manager", "routing", "name", _A, queue="name"),
    _entry("manager", "set_metadata", "name, metadata", _A, queue="name"),
    _entry("manager", "queue_metadata", "name", _A, queue="name"),
    _entry("manager", "set_enabled", "name, enabled", _A, queue="name"),
    _entry("manager", "register_task", "spec, handler", _A, queue="spec.queue"),
    _entry("manager", "scale_consumers", "count=None", _ADMIN),
    _entry("manager", "drain", "node", _ADMIN),
    _entry("manager", "undrain", "node", _ADMIN),
    _entry("manager", "drain_status", "node", _ADMIN),
    _entry("manager", "info", "", _ADMIN),
    _entry("manager", "task_spec", "type_", _ADMIN),
    # the manager's schedules: each account's own (docs/tasks.md, "Schedules")
    _entry("manager", "schedule", "name, type, call, every_s=None, cron=None, tenant=None", _A),
    _entry("manager", "schedules", "", _A),
    _entry("manager", "unschedule", "name", _A),
    # the fairness coordinator
    _entry("coordinator", "report", "", _ADMIN),
    _entry("coordinator", "suspend", "key, reason, by", _ADMIN),
    _entry("coordinator", "resume", "key, by", _ADMIN),
    _entry("coordinator", "set_intervention", "mode, node, enabled, by", _ADMIN),
    _entry("coordinator", "task_stats", "by=None", _ADMIN),
    _entry("coordinator", "flush_events", "", _ADMIN),
    # the flood detector
    _entry("flood", "flooders_now", "", _ADMIN),
    _entry("flood", "events", "", _ADMIN),
    _entry("flood", "flush_events", "", _ADMIN),
)})


def operation(name: str) -> Operation:
    """The entry called ``name`` (``actor.method``). Raises KeyError for no such entry."""
    return OPERATIONS[name]


def of_actor(actor: str) -> dict[str, Operation]:
    """An actor's signed surface: its operations by method name."""
    return {op.method: op for op in OPERATIONS.values() if op.actor == actor}


# Each actor's signed surface, by method name: ``SHARD_OPS["put"]``.
SHARD_OPS = MappingProxyType(of_actor("shard"))
MANAGER_OPS = MappingProxyType(of_actor("manager"))
COORDINATOR_OPS = MappingProxyType(of_actor("coordinator"))
FLOOD_OPS = MappingProxyType(of_actor("flood"))

# Each actor's internal methods: public but never signed, called by the runtime alone (its
# other actors, its start and stop, the tests that drive one round), never by a client.
# Every public method of an actor is in its signed surface above or in its internal table
# (tests/unit/test_operations.py holds it), so a new method is classified when it is added.
# The local channel serves a shard's signed data path only (rayq.channel.CHANNEL_METHODS).
KIT_INTERNAL = frozenset({"ping", "background_failures", "forget_keys"})  # actors.base
SHARD_INTERNAL = KIT_INTERNAL | frozenset({
    "defer", "finish",                            # consumers ending a task alone
    "task_ends", "take_usage",                    # the outcome desks, the fairness coordinator
    "seed", "set_state", "set_ordered", "purge",  # the manager
    "set_diverts", "sweep", "spill_left", "move_matching", "health", "flood_snapshot",
    "enqueue_counts",                             # the flood detector
    "door", "close_door", "channel", "process"})  # hosts and processes
MANAGER_INTERNAL = KIT_INTERNAL | frozenset({
    "directory", "places", "receive_routing", "task_table", "config_value",
    "acquire", "renew", "release", "consumer_count", "fairness_inputs", "set_boost",
    "flood_layout", "add_dedicated", "coalesce", "refresh", "scale_once",
    "shrink_in_sync", "rejoin_in_sync"})
COORDINATOR_INTERNAL = KIT_INTERNAL | frozenset({"plan", "absorb", "evaluate_once"})
FLOOD_INTERNAL = KIT_INTERNAL | frozenset({"detect_once"})
