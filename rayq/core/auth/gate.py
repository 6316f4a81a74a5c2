"""Gate: how a runtime actor checks a signed request before it acts on it.

Unsigned requests act for the ``default`` account (the embedded default). A
signed one is verified against the account keys the gate fetched from the
manager, which also says where each subqueue belongs. The copy is refreshed
when it is older than ``MAX_AGE_S`` and when a verified request names a
subqueue it does not know (a queue made since; fetches at least
``MIN_REFRESH_S`` apart). When accounts, keys or task queues change, the
manager tells every gate to forget its copy before it answers, so a new
key works and a replaced one is refused from the next request on. A forged
request never causes a fetch.

What a request is checked against is its entry in :mod:`rayq.core.auth.operations`: an
actor method carries it with ``@signed(entry)``, and :meth:`Gate.admit` checks the
signature over the arguments bound by name, the queue it names, the subqueues and
receipts the call touches, and whether the operation is the admin's alone.

Seen nonces outlive a restart (rayq.core.auth.nonces): a gate starts with the nonces
its actor stored, and with a ``journal`` it stores each verified request's nonce
before the request acts. Shards pass none: they store nonces in the group commit
of the request itself.

A call from the actor's own process (the SQS endpoint a shard runs for connections
handed to it, through rayq.channel.LocalChannel) carries a :class:`Vouched` instead of a
signature: the process that would verify the signature made it, so the account is
taken as signed, with no HMAC and no nonce; every other check still runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayq.core.auth import nonces
from rayq.core.auth.accounts import (ADMIN, MAX_SKEW_S, Place, Signature, Verifier, check_access,
                                     check_admin)
from rayq.core.auth.operations import Operation, Scope
from rayq.core.auth.quotas import PutTally
from rayq.core.codec.wire import put_count
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.kv import KV
from rayq.core.kit.renewed import Refreshed
from rayq.core.codec.model import DLQ_SUFFIX
from rayq.errors import AuthError, InvalidMessage, QuotaExceeded

MAX_AGE_S = 30.0
MIN_REFRESH_S = 1.0

Directory = tuple[dict[str, list[str]], dict[int, Place]]


class Gate:
    def __init__(self, fetch: Callable[[], Awaitable[Directory]], skew_s: float = MAX_SKEW_S, *,
                 seen: Sequence[int] = (), journal: Callable[[bytes], None] | None = None,
                 clock: Clock | None = None, shard: int | None = None):
        """``shard``: the index of the shard this gate guards (SUBQUEUES operations)."""
        self.shard = shard
        self.clock = clock or SystemClock()
        self._journal = journal
        self._directory: Refreshed[Directory] = Refreshed(
            fetch, ({}, {}), self.clock, max_age_s=MAX_AGE_S, min_gap_s=MIN_REFRESH_S)
        self.tally = PutTally()  # puts admitted against quotas
        self.verifier = Verifier(lambda account: self._keys.get(account, ()), skew_s)
        self.verifier.preload(seen, self.clock.now())

    @property
    def _keys(self) -> dict[str, list[str]]:
        return self._directory.value[0]

    @property
    def _places(self) -> dict[int, Place]:
        return self._directory.value[1]

    def forget(self) -> None:
        """The directory changed: the next signed request fetches it anew (and a fetch
        under way now is not trusted)."""
        self._directory.forget()

    async def _refresh(self, force: bool = False) -> None:
        """Fetch the directory if the copy is old (or ``force``). Callers that come at
        once share one fetch; forced fetches are MIN_REFRESH_S apart (the wait holds
        no lock): :class:`~rayq.core.kit.renewed.Refreshed`."""
        await self._directory.fresh(force)

    async def places(self) -> dict[int, Place]:
        """Where every subqueue belongs (a copy at most MAX_AGE_S old)."""
        await self._refresh()
        return dict(self._places)

    async def admit(self, operation: Operation, auth: Signature | None,
                    arguments: Mapping[str, Any]) -> str:
        """The account a request for ``operation`` with ``arguments`` (bound by name) acts
        for. Raises AuthError unless its signature holds for exactly these, it names the
        queue it was signed for, and its account may run it (and touch every subqueue it
        touches)."""
        if auth is None:
            return ADMIN
        queue = (getattr(auth, "queue", "") if operation.scope is Scope.SUBQUEUES
                 else operation.signed_queue(arguments))
        body = b"" if isinstance(auth, Vouched) else operation.body(arguments)  # no digest to check
        account = await self.account(auth, queue, operation.name, body)
        if operation.scope is Scope.ADMIN:
            check_admin(account, operation.name)
        elif operation.scope is Scope.SUBQUEUES:
            touched = operation.touched(arguments)
            await self.check(account, queue, operation.method, self.shard, touched)
            if operation.stores and account != ADMIN:
                await self.make_room(touched, arguments[operation.stores])
        return account

    async def make_room(self, subqueues: Sequence[int], batch: Any) -> None:
        """Count a put of ``batch`` into ``subqueues`` against their owner's quota (an
        approximate check: :mod:`rayq.core.auth.quotas`). Raises QuotaExceeded."""
        def admit() -> None:
            for sq in subqueues:
                place = self._places.get(sq)
                if place is not None and place.room is not None:
                    size = len(batch) if isinstance(batch, bytes) else 0
                    self.tally.admit(place.room, put_count(batch), size, self.clock.now())
        try:
            admit()
        except QuotaExceeded:
            await self._refresh(force=True)  # the manager may have counted deletes since
            admit()

    async def account(self, auth: Signature | None, queue: str, operation: str,
                      body: bytes) -> str:
        """The account a request acts for; raises AuthError if its signature over ``body``
        does not hold."""
        if auth is None:
            return ADMIN
        if isinstance(auth, Vouched):
            return auth.vouch(queue)
        await self._refresh()
        account = self.verifier.verify(auth, queue, operation, body, self.clock.now())
        if self._journal is not None:  # durable before the request acts
            self._journal(nonces.nonce_key(auth))
        return account

    async def check(self, account: str, queue: str, operation: str, shard: int | None,
                    subqueues: Iterable[Any]) -> None:
        """Raise AuthError unless ``account`` may run ``operation`` on every subqueue."""
        if account == ADMIN:
            return
        subqueues = list(subqueues)
        if not all(isinstance(sq, int) and not isinstance(sq, bool) for sq in subqueues):
            raise AuthError("subqueues are named by their integer ids")
        if any(sq not in self._places for sq in subqueues):
            await self._refresh(force=True)  # a queue made since the last copy
        for sq in subqueues:
            check_access(account, queue, self._places.get(sq), shard, operation)

    async def known(self, subqueues: Iterable[int]) -> dict[int, Place | None]:
        """Where each of ``subqueues`` belongs (None: nowhere known), the directory
        fetched anew first when one is not in the copy (a queue made since)."""
        wanted = list(subqueues)
        await self._refresh()
        if any(sq not in self._places for sq in wanted):
            await self._refresh(force=True)
        return {sq: self._places.get(sq) for sq in wanted}

    def task_types(self, account: str, subqueue: int) -> frozenset[str] | None:
        """The job types ``account`` may put into ``subqueue``, when it is another owner's
        task queue (None: no such limit). Call after :meth:`check` passed."""
        place = self._places.get(subqueue)
        if account == ADMIN or place is None or not place.tasks or place.owner == account:
            return None
        return place.types

    def owns_plain(self, account: str, subqueue: int) -> bool:
        """Whether ``subqueue`` is of a queue ``account`` owns that carries no tasks: its
        puts may key messages by their message group (see ``check_senders``)."""
        place = self._places.get(subqueue)
        return place is not None and place.owner == account and not place.tasks


@dataclass(frozen=True)
class Vouched:
    """A request from the gate's own process, for ``account`` on ``queue`` (see the
    module docstring). Only a shard's in-process channel makes one: frames on the
    socket carry Signatures, and a Ray caller able to pass one may act unsigned, as
    the ``default`` account, anyway."""

    account: str
    queue: str

    @classmethod
    def of(cls, signature: Signature) -> "Vouched":
        return cls(signature.account, signature.queue)

    def vouch(self, queue: str) -> str:
        """The account, for a call on ``queue``. Raises AuthError for another queue."""
        if self.queue != queue:
            raise AuthError("the call is for another queue")
        return self.account


@dataclass(frozen=True)
class Caller:
    """Who a request acts for, handed to a ``@signed`` method that takes a ``caller``
    parameter: its account, and its signature (None when unsigned; a shard stores the
    signature's nonce in the request's own group commit)."""

    account: str
    auth: Signature | None = None


UNSIGNED = Caller(ADMIN)


def signed(operation: Operation) -> Callable:
    """Make an actor method the signed operation ``operation``: the method takes the
    entry's parameters (checked here, at import: TypeError if they differ) and, if it
    wants to know who calls, a keyword-only ``caller``; callers pass ``auth=`` instead,
    which ``self.gate`` (a :class:`Gate`) admits before the method runs."""
    def wrap(method: Callable) -> Callable:
        public, wants_caller = _public_signature(method, operation)

        @functools.wraps(method)
        async def admitted(self, *args: Any, auth: Signature | None = None, **kwargs: Any) -> Any:
            caller = UNSIGNED
            if auth is not None:
                arguments = operation.bind(*args, **kwargs)
                caller = Caller(await self.gate.admit(operation, auth, arguments),
                                None if isinstance(auth, Vouched) else auth)  # no nonce to keep
            if wants_caller:
                kwargs["caller"] = caller
            return await method(self, *args, **kwargs)

        # What Ray and the local channel bind calls to. Ray reads the signature of the
        # innermost function a __wrapped__ chain leads to: the chain ends here.
        admitted.__signature__ = public
        del admitted.__wrapped__
        admitted.operation = operation
        return admitted
    return wrap


def _public_signature(method: Callable, operation: Operation) -> tuple[inspect.Signature, bool]:
    """(``method``'s signature as callers see it: ``caller`` replaced by ``auth``, whether
    it takes ``caller``). Raises TypeError unless it takes the entry's parameters."""
    own = inspect.signature(method)
    params = [p for p in own.parameters.values() if p.name != "caller"]
    shape = [(p.name, p.kind, p.default) for p in params[1:]]  # without self
    if shape != [(p.name, p.kind, p.default) for p in operation.signature.parameters.values()]:
        raise TypeError(f"{method.__qualname__} does not take the parameters of "
                        f"{operation.name}: {operation.signature}")
    wants_caller = "caller" in own.parameters
    if wants_caller and own.parameters["caller"].kind is not inspect.Parameter.KEYWORD_ONLY:
        raise TypeError(f"{method.__qualname__}: caller is a keyword-only parameter")
    auth = inspect.Parameter("auth", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation="Signature | None")
    return own.replace(parameters=[*params, auth]), wants_caller


def durable_gate(fetch: Callable[[], Awaitable[Directory]], kv: KV,
                 clock: Clock | None = None) -> Gate:
    """A gate whose seen nonces live in ``kv``'s nonces table: read back now, and each
    verified request's written (one transaction, one fsync) before it acts. For actors
    whose signed calls are control-plane calls, rare enough to pay a commit each."""
    clock = clock or SystemClock()

    def journal(key: bytes) -> None:
        kv.transact(lambda txn: nonces.remember(txn, [key], clock.now()))
    return Gate(fetch, seen=nonces.load(kv, clock.now()), journal=journal, clock=clock)


def check_reads_own(account: str, subqueues: Any) -> None:
    """Raise AuthError when an account other than the admin reads a whole shard
    (``subqueues`` None) instead of naming its own subqueues."""
    if subqueues is None and account != ADMIN:
        raise AuthError("an account reads the depths of its own subqueues only")


def of_subqueues(rows: Sequence[Any], subqueues: Iterable[int] | None) -> list:
    """The rows (anything with a ``subqueue``) of ``subqueues``; every row for None."""
    if subqueues is None:
        return list(rows)
    wanted = set(subqueues)
    return [row for row in rows if row.subqueue in wanted]


def queues_on(places: dict[int, Place], shard: int) -> dict[int, str]:
    """subqueue -> its queue's runtime-wide name, for the subqueues on ``shard``."""
    return {sq: place.queue for sq, place in places.items() if place.shard == shard}


def per_queue(queues: dict[int, str], counts: dict[int, int]) -> dict[str, int]:
    """Per-subqueue ``counts`` summed per queue (``queues``: subqueue -> queue name)."""
    out: dict[str, int] = {}
    for sq, n in counts.items():
        out[queues[sq]] = out.get(queues[sq], 0) + n
    return out


def check_redrive(places: Mapping[int, Place | None], source: int, target: int,
                  shard: int | None) -> None:
    """Raise InvalidMessage unless ``source`` is the dead-letter subqueue on ``shard`` of
    the queue ``target`` belongs to, there too: a redrive moves dead letters back to the
    queue they came from, and nowhere else."""
    got, to = places.get(source), places.get(target)
    if got is None or to is None or got.queue != to.queue + DLQ_SUFFIX \
            or got.shard != shard or to.shard != shard:
        raise InvalidMessage(f"subqueue {source} is not the dead-letter subqueue, on this "
                             f"shard, of the queue of subqueue {target}")
