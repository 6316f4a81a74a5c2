"""What one account may hold of an SQS replica, and how a long poll waits.

A replica runs operations on a small thread pool (a rayq Client is synchronous), but
for the message actions, which begin on its event loop (``SqsApi.on_loop``). So that
no account can starve another: each account holds at most
``threads_per_account`` of the threads and ``in_flight_per_account`` admitted
requests (more are refused with SQS's ``RequestThrottled``, which SDKs retry), taken
only once the request's signature is checked; verified request bodies buffered at once
are bounded in bytes across all accounts, unverified ones in number per peer address
(:class:`Unverified`); bodies past OFF_LOOP_BYTES are hashed and parsed on a worker
thread (:func:`off_loop`); and a long poll never parks on a thread: its operation
answers :class:`Parked`, and the replica awaits the shard's own parked receive on its
event loop (still one of the account's admitted requests). Receipt forwards are kept per queue owner
(:class:`Forwards`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from rayq.errors import RayqError
from rayq.sqs.errors import SqsError, from_rayq

MAX_FORWARDS_PER_ACCOUNT = 20_000  # receipt forwards kept per queue owner (oldest go first)
OFF_LOOP_BYTES = 64 << 10  # bodies past this are hashed and parsed on a worker thread


def throttled(account: str) -> SqsError:
    return SqsError("RequestThrottled", f"Account {account!r} has too many requests in "
                    "flight at this endpoint; retry with back-off.", status=400)


@dataclass(frozen=True)
class EndpointStats:
    """What an endpoint holds at one moment: open ``connections``; ``unverified``
    requests whose body is being read before their signature can be checked (each held
    by its peer, :class:`Unverified`); ``buffered_bytes`` of the shared body budget held
    by verified requests; ``in_flight`` requests admitted over every account."""

    connections: int
    unverified: int
    buffered_bytes: int
    in_flight: int


class Shares:
    """Each account's share of a replica: admitted requests and worker threads."""

    def __init__(self, *, in_flight_per_account: int, threads_per_account: int):
        self.in_flight_per_account = in_flight_per_account
        self.threads_per_account = threads_per_account
        self._in_flight: dict[str, int] = {}
        self._threads: dict[str, asyncio.Semaphore] = {}

    def in_flight(self, account: str) -> int:
        return self._in_flight.get(account, 0)

    def total_in_flight(self) -> int:
        return sum(self._in_flight.values())

    @contextlib.contextmanager
    def admit(self, account: str) -> Iterator[None]:
        """Hold one of ``account``'s request slots. Raises SqsError (RequestThrottled)."""
        with _counted(self._in_flight, account, self.in_flight_per_account,
                      partial(throttled, account)):
            yield

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


def announced_size(content_length: int | None, body_exists: bool, max_bytes: int) -> int:
    """A request body's announced length, checked before a byte of it is read. Raises
    SqsError (411 without one, 413 past ``max_bytes``)."""
    if content_length is None:
        if body_exists:
            raise SqsError("MissingContentLength", "A request body needs a Content-Length.",
                           status=411)
        return 0
    if content_length > max_bytes:
        raise SqsError("RequestEntityTooLarge", f"The request body is over {max_bytes} "
                       "bytes.", status=413)
    return content_length


class Unverified:
    """Requests whose signature is not checked yet, counted per peer: a request whose
    body hash is not signed is verified only once its body is read, and until then it
    holds nothing shared (not the body budget, not an account's slots), only one of its
    peer's ``per_peer``. A peer is an IPv4 address or an IPv6 /64 (what one host gets)."""

    def __init__(self, per_peer: int):
        self.per_peer = per_peer
        self._held: dict[str, int] = {}

    def held(self, remote: str | None) -> int:
        return self._held.get(peer_of(remote), 0)

    def total(self) -> int:
        return sum(self._held.values())

    @contextlib.contextmanager
    def hold(self, remote: str | None) -> Iterator[None]:
        """Hold one of the peer's unverified requests. Raises SqsError
        (ServiceUnavailable, a retryable 503) when it has ``per_peer`` already."""
        with _counted(self._held, peer_of(remote), self.per_peer, _unverified_refusal):
            yield


def _unverified_refusal() -> SqsError:
    return SqsError("ServiceUnavailable", "Too many unverified requests from this address; "
                    "retry with back-off, or sign the body's hash (X-Amz-Content-SHA256).",
                    status=503, sender=False)


@contextlib.contextmanager
def _counted(counts: dict[str, int], key: str, limit: int,
             refusal: Callable[[], SqsError]) -> Iterator[None]:
    """One more of ``key`` in ``counts`` while the block runs (a key at 0 is dropped, so
    the dict holds only what is held); raises ``refusal()`` when ``key`` has ``limit``."""
    held = counts.get(key, 0)
    if held >= limit:
        raise refusal()
    counts[key] = held + 1
    try:
        yield
    finally:
        counts[key] -= 1
        if not counts[key]:
            del counts[key]


def peer_of(remote: str | None) -> str:
    """The peer a remote address counts for: itself for IPv4, its /64 for IPv6."""
    if not remote:
        return ""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if address.version == 6 and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(getattr(address, "ipv4_mapped", None) or address)


async def off_loop(size_bytes: int, pool: Executor, fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` (hashing or parsing a body of ``size_bytes``): on ``pool`` past
    OFF_LOOP_BYTES, so an 8 MiB body does not hold the event loop (tens of ms) that every
    other connection of the process, a shard's own calls included, waits on; at once
    below, where a thread hop would cost more than the work."""
    if size_bytes <= OFF_LOOP_BYTES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


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
