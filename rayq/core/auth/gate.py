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

Seen nonces outlive a restart (rayq.core.auth.nonces): a gate starts with the nonces
its actor stored, and with a ``journal`` it stores each verified request's nonce
before the request acts. Shards pass none: they store nonces in the group commit
of the request itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from rayq.core.auth import nonces
from rayq.core.auth.accounts import (ADMIN, MAX_SKEW_S, Place, Signature, Verifier, check_access,
                            check_admin, request_body)
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.kv import KV
from rayq.core.codec.model import Receipt
from rayq.errors import AuthError, ReceiptInvalid

MAX_AGE_S = 30.0
MIN_REFRESH_S = 1.0

Directory = tuple[dict[str, list[str]], dict[int, Place]]


class Gate:
    def __init__(self, fetch: Callable[[], Awaitable[Directory]], skew_s: float = MAX_SKEW_S, *,
                 seen: Sequence[int] = (), journal: Callable[[bytes], None] | None = None,
                 clock: Clock | None = None):
        self._fetch = fetch
        self.clock = clock or SystemClock()
        self._journal = journal
        self._keys: dict[str, list[str]] = {}
        self._places: dict[int, Place] = {}
        self._fetched_at = float("-inf")
        self._generation = 0  # bumped by forget(): a fetch begun before is not trusted
        self._lock = asyncio.Lock()
        self.verifier = Verifier(lambda account: self._keys.get(account, ()), skew_s)
        self.verifier.preload(seen, self.clock.now())

    def forget(self) -> None:
        """Drop the copy: the next signed request fetches the directory anew."""
        self._generation += 1
        self._keys, self._fetched_at = {}, float("-inf")

    async def _refresh(self, force: bool = False) -> None:
        """Fetch the directory if the copy is old (or ``force``). Callers that come at
        once share one fetch; forced fetches are MIN_REFRESH_S apart (the wait holds
        no lock)."""
        asked = self.clock.monotonic()
        if not force and asked - self._fetched_at < MAX_AGE_S:
            return
        wait = self._fetched_at + MIN_REFRESH_S - asked
        if wait > 0:
            await asyncio.sleep(wait)
        async with self._lock:
            while self._fetched_at < asked:
                generation = self._generation
                keys, places = await self._fetch()
                if generation == self._generation:  # not forgotten meanwhile
                    self._keys, self._places = keys, places
                    self._fetched_at = self.clock.monotonic()

    async def places(self) -> dict[int, Place]:
        """Where every subqueue belongs (a copy at most MAX_AGE_S old)."""
        await self._refresh()
        return dict(self._places)

    async def account(self, auth: Signature | None, queue: str, operation: str, *args: Any) -> str:
        """The account a request acts for; raises AuthError if its signature does not hold."""
        if auth is None:
            return ADMIN
        await self._refresh()
        account = self.verifier.verify(auth, queue, operation, request_body(*args),
                                       self.clock.now())
        if self._journal is not None:  # durable before the request acts
            self._journal(nonces.nonce_key(auth))
        return account

    async def admin(self, auth: Signature | None, operation: str, *args: Any) -> str:
        """Like :meth:`account`, for operations only the ``default`` account may run."""
        account = await self.account(auth, "", operation, *args)
        check_admin(account, operation)
        return account

    async def check(self, account: str, queue: str, operation: str, shard: int,
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

    def task_types(self, account: str, subqueue: int) -> frozenset[str] | None:
        """The job types ``account`` may put into ``subqueue``, when it is another owner's
        task queue (None: no such limit). Call after :meth:`check` passed."""
        place = self._places.get(subqueue)
        if account == ADMIN or place is None or not place.tasks or place.owner == account:
            return None
        return place.types

    async def allow(self, auth: Signature | None, operation: str, shard: int,
                    subqueues: Iterable[Any], *args: Any) -> str:
        """Verify a shard request and check it touches only subqueues of the queue it is
        signed for that its account may use; returns the account."""
        queue = getattr(auth, "queue", "")
        account = await self.account(auth, queue, operation, *args)
        await self.check(account, queue, operation, shard, subqueues)
        return account


def durable_gate(fetch: Callable[[], Awaitable[Directory]], kv: KV,
                 clock: Clock | None = None) -> Gate:
    """A gate whose seen nonces live in ``kv``'s nonces table: read back now, and each
    verified request's written (one transaction, one fsync) before it acts. For actors
    whose signed calls are control-plane calls, rare enough to pay a commit each."""
    clock = clock or SystemClock()

    def journal(key: bytes) -> None:
        kv.transact(lambda txn: nonces.remember(txn, [key], clock.now()))
    return Gate(fetch, seen=nonces.load(kv, clock.now()), journal=journal, clock=clock)


def named_subqueues(subqueues: Any) -> list:
    """The subqueues a request names, for :meth:`Gate.check` (a non-list names none
    that may be used: the gate refuses it for an account)."""
    return list(subqueues) if isinstance(subqueues, (list, tuple)) else [None]


def receipt_subqueues(receipts: Any) -> list:
    """The subqueues receipts point into; malformed ones are left to the store to refuse."""
    out = []
    for receipt in named_subqueues(receipts):
        try:
            out.append(Receipt.decode(receipt).subqueue)
        except ReceiptInvalid:
            pass
    return out


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
