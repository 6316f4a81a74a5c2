"""The table of a shard's write operations, and how one call of a group runs alone.

Every operation is a function ``fn(ledger, env, *args, **kwargs)`` over one write
transaction's :class:`~rayq.core.storage.ledger.Ledger`; :data:`OPERATIONS` names
each, and the store (and its group commit) reaches them only through it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from rayq.core.storage import messages, outcomes, purge, spill
from rayq.core.storage.ledger import Env, Ledger
from rayq.errors import InvalidMessage, RayqError

Operation = Callable[..., Any]

OPERATIONS: Mapping[str, Operation] = MappingProxyType({
    "put": messages.put,
    "receive": messages.receive,
    "delete": messages.delete,
    "change_visibility": messages.change_visibility,
    "defer": messages.defer,
    "collect_expired": messages.collect_expired,
    "finish": outcomes.finish,
    "record_usage": outcomes.record_usage,
    "take_usage": outcomes.take_usage,
    "sweep": spill.sweep,
    "move_matching": spill.move_matching,
    "clear": purge.clear,
    "purge_step": purge.purge_step,
})
# What a caller may name in a group commit (purge_step is the store's own).
GROUPABLE = frozenset(OPERATIONS) - {"purge_step"}


def run_isolated(w: Ledger, env: Env, name: str, args: tuple, kwargs: dict) -> Any:
    """Run one call in a nested transaction; a RayqError (or arguments that do not fit
    the operation: InvalidMessage) undoes it alone and is returned. Any other exception
    is a bug of the store and propagates, aborting the whole transaction."""
    fn = OPERATIONS.get(name) if name in GROUPABLE else None
    if fn is None:
        return InvalidMessage(f"unknown store operation {name!r}")
    parent, point = w.txn, w.savepoint()
    try:
        with parent.nested() as child:
            w.txn = child
            return fn(w, env, *args, **kwargs)
    except (RayqError, TypeError) as err:
        if not isinstance(err, RayqError):
            # A TypeError is the caller's only when the arguments do not fit the
            # signature; one raised inside the operation is a store bug: it goes up
            # and aborts the whole transaction (the store turns it into StoreBug).
            err = _misfit_arguments(fn, (w, env, *args), kwargs)
            if err is None:
                raise
        w.rollback(point)
        return err
    finally:
        w.txn = parent


def _misfit_arguments(fn: Operation, args: tuple, kwargs: dict) -> InvalidMessage | None:
    """InvalidMessage when ``args``/``kwargs`` do not fit ``fn``'s signature, else None."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as err:
        return InvalidMessage(f"bad arguments to {getattr(fn, '__name__', fn)}: {err}")
    return None


# -- a small group ----------------------------------------------------------------------
SMALL_CALLS = 4             # store calls in one group commit
SMALL_PUT_BYTES = 64 << 10  # bytes of one put's batch
SMALL_ROWS = 100            # rows one receive or delete may touch
_SMALL: Mapping[str | None, Callable[[tuple], bool]] = MappingProxyType({
    "put": lambda args: len(args[1]) <= SMALL_PUT_BYTES,
    "receive": lambda args: args[1] <= SMALL_ROWS,
    "delete": lambda args: len(args[0]) <= SMALL_ROWS,
    "change_visibility": lambda args: True,
    "defer": lambda args: True,
    "finish": lambda args: True,
    "record_usage": lambda args: True,
    None: lambda args: True,  # a signed read's nonce alone
})


def small_group(calls: list) -> bool:
    """Whether a group commit of ``calls`` ((operation name or None, args, kwargs, nonce))
    touches only a few rows: cheap enough for a shard to run on its event loop."""
    return len(calls) <= SMALL_CALLS and all(
        name in _SMALL and _SMALL[name](args) for name, args, _, _ in calls)

