"""The shard's end of the local channel (:mod:`rayq.core.codec.frames`): a Unix socket
server on the actor's own event loop.

Each request runs the same async method a Ray call would run (the gate's checks
included), as its own task, so a parked long poll does not hold up the requests
behind it. The socket lives in a fresh 0700 directory: only the user that runs
Ray can connect, as only it can reach the LMDB files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import logging
import os
import shutil
import stat
import tempfile
from typing import Any

from rayq.channel import host_id, run_on, serve_in_process
from rayq.core.auth.accounts import Signature
from rayq.core.auth.gate import Vouched
from rayq.core.auth.operations import Binder
from rayq.core.codec.frames import (HEADER, MAX_FRAME_BYTES, FrameError, decode_request,
                              encode_failure, encode_reply)
from rayq.errors import InvalidMessage, RayqError, RuntimeFailure

log = logging.getLogger("rayq.channel")


def socket_dir(home: str | None, name: str) -> str:
    """A private folder for a socket: one per ``name`` and data directory ``home``, mode
    0700, kept across restarts (a restarted actor binds in it again, so restarts leave
    nothing behind); a fresh one if that folder is not ours alone, or ``home`` is None."""
    key = None if home is None else hashlib.blake2b(os.path.abspath(home).encode(),
                                                    digest_size=6).hexdigest()
    prefix = f"rayq-{os.getuid()}-{key}-{name}"
    if key is None:
        return tempfile.mkdtemp(prefix=prefix + "-")
    directory = os.path.join(tempfile.gettempdir(), prefix)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        info = os.lstat(directory)
        if not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
                and stat.S_IMODE(info.st_mode) == 0o700):
            return tempfile.mkdtemp(prefix=prefix + "-")  # someone else's: not used
    return directory


class ChannelServer:
    """Serves ``methods`` of ``target`` (async methods taking ``auth=``) on a Unix socket."""

    def __init__(self, target: Any, methods: frozenset[str], name: str, home: str | None = None):
        """``home``: the data directory this server's shard keeps, which names its socket
        folder (None: a fresh folder each start)."""
        self._target, self._name, self._home = target, name, home
        self._methods = {m: Binder(inspect.signature(getattr(target, m))) for m in methods}
        self._server: asyncio.base_events.Server | None = None
        self._dir: str | None = None
        self._starting = asyncio.Lock()  # concurrent first asks start one server
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the shard's, once serve_here ran

    async def address(self) -> tuple[str, str]:
        """(host id, socket path), starting the server on first use."""
        async with self._starting:  # starting yields to the loop: others wait, not start
            if self._server is None:
                directory = socket_dir(self._home, self._name)
                path = os.path.join(directory, "s")
                if os.path.exists(path):
                    os.unlink(path)  # our previous incarnation's socket
                self._server = await asyncio.start_unix_server(self._serve, path,
                                                               limit=1 << 20)
                self._dir = directory
        return host_id(), os.path.join(self._dir, "s")

    async def serve_here(self) -> str:
        """Let this process's own links to the shard call it in-process
        (:class:`rayq.channel.LocalChannel`) rather than over the socket; the socket's
        folder (0700, the shard's alone)."""
        _, path = await self.address()
        self._loop = asyncio.get_running_loop()
        serve_in_process(path, self._call_here)
        return self._dir

    def _call_here(self, method: str, args: tuple, kwargs: dict,
                   auth: Signature | None) -> concurrent.futures.Future | asyncio.Task:
        """A call from this process (rayq.channel.LocalChannel), from any thread: the
        method runs on the shard's event loop, as a socket's call would, its signature
        vouched for (rayq.core.auth.gate.Vouched): this process made it. Made on that
        loop itself (the shard's own SQS endpoint), it is a task of the loop: no hand-off."""
        kwargs = self._bind(method, args, kwargs, None if auth is None else Vouched.of(auth))
        running = getattr(self._target, method)(*args, **kwargs)
        return run_on(self._loop, running)

    def close(self) -> None:
        """Stop listening and drop every connection: their unanswered calls fail with
        ChannelLost at the client, as when the shard dies."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                if size > MAX_FRAME_BYTES:
                    raise FrameError(f"a frame of {size} bytes")
                body = await reader.readexactly(size)
                task = asyncio.create_task(self._answer(body, writer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; its unanswered calls are its to retry
        except FrameError as err:
            log.warning("%s channel: dropping a connection: %s", self._name, err)
        finally:
            self._writers.discard(writer)
            writer.close()

    def _bind(self, method: str, args: list, kwargs: dict, auth: Signature | None) -> dict:
        """The call's keyword arguments, ``auth`` included; refuses a method the channel
        does not serve, arguments it does not take, and auth anywhere but the frame's
        own field (where frames.decode_request checked it is a Signature)."""
        bind = self._methods.get(method)
        if bind is None or "auth" in kwargs:
            raise InvalidMessage(f"{method!r} is not served on the local channel")
        if auth is not None:
            kwargs = {**kwargs, "auth": auth}
        try:
            bound = bind(args, kwargs)
        except TypeError as err:
            raise InvalidMessage(f"{method}: {err}") from None
        if bound.get("auth") is not auth:  # a positional argument in auth's place
            raise InvalidMessage(f"{method}: auth travels in the frame, not as an argument")
        return kwargs

    async def _answer(self, body: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            call_id, method, args, kwargs, auth = decode_request(body)
        except FrameError as err:
            log.warning("%s channel: %s", self._name, err)
            writer.close()
            return
        try:
            kwargs = self._bind(method, args, kwargs, auth)
            reply = encode_reply(call_id, await getattr(self._target, method)(*args, **kwargs))
        except Exception as err:
            reply = self._failure(call_id, method, err)
        if not writer.is_closing():
            writer.write(reply)
            try:
                await writer.drain()
            except ConnectionError:
                pass  # the client went away while its answer was on the way

    def _failure(self, call_id: int, method: str, err: Exception) -> bytes:
        """The reply for a call that raised: a RayqError as itself, anything else (or a
        RayqError that cannot be pickled: the caller must hear something, never
        nothing) as RuntimeFailure, as a Ray call would report it."""
        if isinstance(err, RayqError):
            try:
                return encode_failure(call_id, err)
            except Exception:
                pass
        log.exception("%s channel: %s failed", self._name, method)
        return encode_failure(call_id, RuntimeFailure(f"runtime call failed: {err!r}"))
