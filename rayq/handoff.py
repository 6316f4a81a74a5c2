"""Handing an open HTTP connection to another process on the same host.

SQS clients send every request to one endpoint URL, so an SQS replica accepts every
connection, and each request then costs a second process hop: replica to shard. When
a plain-HTTP connection's requests go to a queue whose subqueues all live in one
shard on the replica's host, the replica hands the connection itself to that shard's
process, which answers its later requests in-process (docs/sqs-endpoint.md,
"Connections move to their queue's shard").

The socket travels by SCM_RIGHTS through the shard's *door*, a Unix datagram socket
in the shard's 0700 channel folder. The replica hands it over between two requests:
it stops reading before it writes its answer, so the client's next request waits in
the kernel until the shard reads it. A connection with anything else in flight (TLS
state, a pipelined request already read, a body not read to its end, an answer not yet
written out) stays where it is. Only a client that pipelines (sends its next request
before the answer) and splits that request's headers across packets could lose it
here, as a timeout it retries: SQS SDKs do not pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from rayq.errors import RayqError

if TYPE_CHECKING:  # aiohttp is loaded by the endpoint, not by every shard that imports this
    from aiohttp import web

log = logging.getLogger("rayq.handoff")

MAX_FDS = 16  # sockets taken from the door per read
ASK_AGAIN_S = 5.0  # a shard without a door (gone, elsewhere, restarting) is asked again after


class Door:
    """The receiving end, in the shard's process: every socket passed through ``path``
    is handed to ``adopt`` on the running event loop."""

    def __init__(self, path: str, adopt: Callable[[socket.socket], None]):
        if os.path.exists(path):
            os.unlink(path)  # our previous incarnation's door
        self.path, self._adopt = path, adopt
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        self._sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._receive)

    def _receive(self) -> None:
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(self._sock, 1, MAX_FDS)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("the door at %s failed: %s", self.path, err)
                return
            for fd in fds:
                self._adopt(socket.socket(fileno=fd))

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def adopt_into(server: web.Server, max_connections: int) -> Callable[[socket.socket], None]:
    """``adopt`` for a :class:`Door`: the socket becomes a connection of aiohttp's
    ``server`` (the factory of its request handlers), which reads its next request.
    Past ``max_connections`` it is closed instead: the client connects anew, to a
    replica."""
    loop = asyncio.get_running_loop()

    def adopt(sock: socket.socket) -> None:
        if len(server.connections) >= max_connections:
            sock.close()
            return
        sock.setblocking(False)
        task = loop.create_task(loop.connect_accepted_socket(server, sock))
        task.add_done_callback(_log_failure)
    return adopt


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("an adopted connection failed: %s", task.exception())


def movable(request: web.Request) -> bool:
    """Whether ``request``'s connection could move after it is answered: plain HTTP,
    kept alive, its body read to the end, and no later request already read from it."""
    transport = request.transport
    return (transport is not None and not transport.is_closing()
            and transport.get_extra_info("sslcontext") is None
            and request.keep_alive and request.content.at_eof()
            and not getattr(request.protocol, "_messages", True))


async def hand_off(request: web.Request, response: web.StreamResponse, door: str) -> bool:
    """Answer ``request`` with ``response``, then pass its connection through ``door``;
    whether it went (if not, this process keeps serving it). Call when
    :func:`movable`."""
    transport = request.transport
    transport.pause_reading()  # the client's next request waits in the kernel
    await response.prepare(request)
    await response.write_eof()
    sock = transport.get_extra_info("socket")
    if (transport.get_write_buffer_size() or transport.is_closing() or sock is None
            or getattr(request.protocol, "_messages", True)):
        transport.resume_reading()
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as out:
        out.setblocking(False)
        try:
            out.connect(door)
            socket.send_fds(out, [b"c"], [sock.fileno()])
        except OSError:  # the shard is gone or its door full: keep it here
            transport.resume_reading()
            return False
    transport.close()  # our copy only: the shard's keeps the connection open
    return True


class Doors:
    """A replica's side: whether a connection moves, weighed once per connection at its
    first request of one of ``actions``. ``ask(shard)`` awaits that shard's (host id,
    door path); a shard on another host has no door for us."""

    def __init__(self, pool, ask: Callable[[int], Awaitable[tuple[str, str]]],
                 actions: Iterable[str], here: str):
        self._pool, self._ask, self._actions, self._here = pool, ask, frozenset(actions), here
        self._seen: weakref.WeakSet = weakref.WeakSet()  # connections already weighed
        self._doors: dict[int, tuple[str | None, float]] = {}  # shard -> (path, asked at)

    async def answer(self, request: web.Request, response: web.StreamResponse, action: str,
                     home: Callable[[], int | None]) -> web.StreamResponse:
        """``response``; written here and the connection handed to its queue's shard when
        that shard has a door on this host. ``home()`` (blocking: run on the pool) names
        the one shard the request's queue lives in, or None."""
        if (action not in self._actions or request.transport in self._seen
                or not movable(request)):
            return response
        self._seen.add(request.transport)
        shard = await asyncio.get_running_loop().run_in_executor(self._pool, home)
        door = await self._door(shard) if shard is not None else None
        if door is not None and not await hand_off(request, response, door):
            self._doors.pop(shard, None)  # gone or full: asked again for the next one
        return response

    async def _door(self, shard: int) -> str | None:
        path, asked_at = self._doors.get(shard, (None, float("-inf")))
        if path is None and time.monotonic() - asked_at > ASK_AGAIN_S:
            try:
                host, path = await self._ask(shard)
            except RayqError:  # down or restarting: not now
                host = None
            path = path if host == self._here else None
            self._doors[shard] = (path, time.monotonic())
        return path


class Served(NamedTuple):
    """What a :class:`Host` runs for the connections handed to it: an aiohttp server (the
    factory of its request handlers), how many connections it takes, and the coroutine
    function that closes them all."""

    server: web.Server
    max_connections: int
    close: Callable[[], Awaitable[None]]


class Host:
    """A shard's side: its door and the server answering what comes through it, both
    started on the first ask and closed when the endpoint stops. The shard knows
    nothing of that server: whoever asks first names it."""

    def __init__(self):
        self._lock = asyncio.Lock()
        self._door: Door | None = None
        self._served: Served | None = None

    async def door(self, folder: Callable[[], Awaitable[str]],
                   start: Callable[[], Awaitable[Served]]) -> str:
        """The door's path, in ``folder()``; ``start()`` starts the server on the first ask."""
        async with self._lock:
            if self._door is None:
                served = await start()
                self._door = Door(os.path.join(await folder(), "door"),
                                  adopt_into(served.server, served.max_connections))
                self._served = served
            return self._door.path

    async def close(self) -> None:
        async with self._lock:
            if self._door is not None:
                self._door.close()
                await self._served.close()
                self._door = self._served = None
