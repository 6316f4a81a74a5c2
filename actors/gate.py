"""Gate: where a runtime actor checks a signed request before it acts on it.

Unsigned requests act for the ``default`` account (the embedded default). A
signed one is verified against the account keys the gate fetched from the
manager, which also says which account owns each subqueue. The copy is
refreshed when it is older than ``MAX_AGE_S``, when a signature matches none
of the keys it knows or a subqueue is unknown (at most once per
``MIN_REFRESH_S``: forged requests wait rather than hammer the manager), and
at once after the manager says keys were rotated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import ray

from actors import MANAGER, NAMESPACE
from rayq.core.auth import (ADMIN, MAX_SKEW_S, Place, Signature, SignatureMismatch, Verifier,
                            check_access, check_admin, request_body)

MAX_AGE_S = 30.0
MIN_REFRESH_S = 1.0

Directory = tuple[dict[str, list[str]], dict[int, Place]]


class Gate:
    def __init__(self, fetch: Callable[[], Awaitable[Directory]], skew_s: float = MAX_SKEW_S):
        self._fetch = fetch
        self._keys: dict[str, list[str]] = {}
        self._places: dict[int, Place] = {}
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()
        self.verifier = Verifier(lambda account: self._keys.get(account, ()), skew_s)

    def forget(self) -> None:
        """Drop the copy: the next signed request fetches the directory anew."""
        self._fetched_at = float("-inf")

    async def _refresh(self, force: bool = False) -> bool:
        """Fetch the directory if the copy is old (or ``force``); True when the copy is
        newer than this call. Fetches are at least MIN_REFRESH_S apart: a caller that
        comes sooner waits for the next one."""
        asked = time.monotonic()
        if not force and asked - self._fetched_at < MAX_AGE_S:
            return False
        async with self._lock:
            if self._fetched_at >= asked:
                return True  # fetched by another request while this one waited
            wait = self._fetched_at + MIN_REFRESH_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._keys, self._places = await self._fetch()
            self._fetched_at = time.monotonic()
            return True

    async def account(self, auth: Signature | None, queue: str, operation: str, *args: Any) -> str:
        """The account a request acts for; raises AuthError if its signature does not hold."""
        if auth is None:
            return ADMIN
        await self._refresh()
        body = request_body(*args)
        try:
            return self.verifier.verify(auth, queue, operation, body, time.time())
        except SignatureMismatch:
            if not await self._refresh(force=True):
                raise
            return self.verifier.verify(auth, queue, operation, body, time.time())

    async def admin(self, auth: Signature | None, operation: str, *args: Any) -> str:
        """Like :meth:`account`, for operations only the ``default`` account may run."""
        account = await self.account(auth, "", operation, *args)
        check_admin(account, operation)
        return account

    async def check(self, account: str, queue: str, operation: str, shard: int,
                    subqueues: Iterable[int], tenants: Sequence[str] = ()) -> None:
        """Raise AuthError unless ``account`` may run ``operation`` on every subqueue."""
        if account == ADMIN:
            return
        subqueues = list(subqueues)
        if any(sq not in self._places for sq in subqueues):
            await self._refresh(force=True)  # a queue made since the last copy
        for sq in subqueues:
            check_access(account, queue, self._places.get(sq), shard, operation, tenants)

    async def allow(self, auth: Signature | None, operation: str, shard: int,
                    subqueues: Iterable[int], *args: Any, tenants: Sequence[str] = ()) -> str:
        """Verify a shard request and check it touches only subqueues of the queue it is
        signed for that its account may use; returns the account."""
        queue = getattr(auth, "queue", "")
        account = await self.account(auth, queue, operation, *args)
        await self.check(account, queue, operation, shard, subqueues, tenants)
        return account


async def manager_directory() -> Directory:
    """The directory as the manager holds it (how actors other than the manager fetch)."""
    manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
    return await manager.directory.remote()
