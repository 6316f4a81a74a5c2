"""What one account may hold of an SQS replica, and how a long poll waits.

A replica runs operations on a small thread pool (a rayq Client is synchronous), but
for the message actions, which begin on its event loop (``SqsApi.on_loop``). So that
no account can starve another: each account holds at most
``threads_per_account`` of the threads and ``in_flight_per_account`` admitted
requests (more are refused with SQS's ``RequestThrottled``, which SDKs retry);
request bodies buffered at once are bounded in bytes across all accounts; and a
long poll never parks on a thread: its operation answers :class:`Parked`, and the
replica awaits the shard's own parked receive on its event loop (still one of the
account's admitted requests). Receipt forwards are kept per queue owner
(:class:`Forwards`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from rayq.errors import RayqError
from rayq.sqs.errors import SqsError, from_rayq

MAX_FORWARDS_PER_ACCOUNT = 20_000  # receipt forwards kept per queue owner (oldest go first)


def throttled(account: str) -> SqsError:
    return SqsError("RequestThrottled", f"Account {account!r} has too many requests in "
                    "flight at this endpoint; retry with back-off.", status=400)


class Shares:
    """Each account's share of a replica: admitted requests and worker threads."""

    def __init__(self, *, in_flight_per_account: int, threads_per_account: int):
        self.in_flight_per_account = in_flight_per_account
        self.threads_per_account = threads_per_account
        self._in_flight: dict[str, int] = {}
        self._threads: dict[str, asyncio.Semaphore] = {}

    def in_flight(self, account: str) -> int:
        return self._in_flight.get(account, 0)

    @contextlib.contextmanager
    def admit(self, account: str) -> Iterator[None]:
        """Hold one of ``account``'s request slots. Raises SqsError (RequestThrottled)."""
        held = self._in_flight.get(account, 0)
        if held >= self.in_flight_per_account:
            raise throttled(account)
        self._in_flight[account] = held + 1
        try:
            yield
        finally:
            self._in_flight[account] -= 1
            if not self._in_flight[account]:
                del self._in_flight[account]

    async def in_thread(self, account: str, pool: Executor, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on ``pool`` once one of ``account``'s threads is free."""
        gate = self._threads.get(account)
        if gate is None:
            gate = self._threads[account] = asyncio.Semaphore(self.threads_per_account)
        async with gate:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


class BodyBudget:
    """Bytes of request bodies a replica buffers at once, over all connections."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes, self.held_bytes = limit_bytes, 0

    @contextlib.contextmanager
    def hold(self, size_bytes: int) -> Iterator[None]:
        """Reserve ``size_bytes`` while reading a body. Raises SqsError
        (ServiceUnavailable, a retryable 503) when the budget is spent."""
        if self.held_bytes + size_bytes > self.limit_bytes:
            raise SqsError("ServiceUnavailable", "The endpoint is reading too many request "
                           "bodies at once; retry with back-off.", status=503, sender=False)
        self.held_bytes += size_bytes
        try:
            yield
        finally:
            self.held_bytes -= size_bytes


def _never(result: Any) -> bool:
    return False


@dataclass(frozen=True)
class Parked:
    """An operation's answer still to come: ``then`` of what ``waiting`` (an awaitable,
    e.g. :meth:`rayq.queue.Queue.receive_async`) gives. The replica awaits :meth:`result`
    on its event loop, so no thread waits for a shard (a parked long poll above all), and
    then runs :meth:`finish` on a worker thread, or on the loop when ``quick(result)``
    says ``then`` makes no call."""

    waiting: Awaitable[Any]
    then: Callable[[Any], dict]
    quick: Callable[[Any], bool] = _never

    def followed(self, fn: Callable[[Any], Any]) -> "Parked":
        """The same wait, its answer passed on through ``fn``."""
        return replace(self, then=lambda got: fn(self.then(got)))

    async def result(self) -> Any:
        """What the operation waited for, awaited on the event loop. Raises SqsError (a
        rayq error translated)."""
        try:
            return await self.waiting
        except RayqError as err:
            raise from_rayq(err) from err

    def finish(self, result: Any) -> dict:
        """The response made of ``result`` (it may call the runtime: run it on a worker
        thread). Raises SqsError (a rayq error translated)."""
        try:
            return self.then(result)
        except RayqError as err:
            raise from_rayq(err) from err


class Forwards:
    """handle -> current receipt, per queue owner, each owner's bounded (oldest out)."""

    def __init__(self, per_owner: int = MAX_FORWARDS_PER_ACCOUNT):
        self.per_owner = per_owner
        self._by_owner: dict[str, OrderedDict[str, str]] = {}

    def get(self, owner: str, handle: str) -> str | None:
        return self._by_owner.get(owner, {}).get(handle)

    def put(self, owner: str, handle: str, receipt: str) -> None:
        mine = self._by_owner.setdefault(owner, OrderedDict())
        mine[handle] = receipt
        mine.move_to_end(handle)
        while len(mine) > self.per_owner:
            mine.popitem(last=False)
