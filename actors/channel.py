"""The shard's end of the channel (:mod:`rayq.core.codec.frames`): a Unix socket server
on the actor's own event loop for clients on its host, and a TCP server on its node's
address for clients on other hosts.

Each request runs the same async method a Ray call would run (the gate's checks
included), as its own task, so a parked long poll does not hold up the requests
behind it. The socket lives in a fresh 0700 directory: only the user that runs
Ray can connect, as only it can reach the LMDB files. Over TCP every frame is keyed
(:mod:`rayq.core.codec.keyed`) with a key the shard makes at start and hands out only
through Ray (the ``channel`` call), to callers Ray let in, and inside TLS with Ray's
certificates when Ray's TLS is on; the signed requests are checked by the gate as over
any path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import itertools
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from typing import Any

from rayq.channel import host_id, run_on, serve_in_process
from rayq.core.auth.accounts import Signature
from rayq.core.auth.gate import Vouched
from rayq.core.auth.operations import Binder
from rayq.core.codec.frames import (HEADER, MAX_FRAME_BYTES, FrameError, decode_request,
                              encode_failure, encode_reply)
from rayq.core.codec.keyed import (ANSWER, HELLO_TIMEOUT_S, MAC_BYTES, NONCE_BYTES, REQUEST,
                                   checks, frame_mac, new_key, proves_key, ray_tls)
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
    """Serves ``methods`` of ``target`` (async methods taking ``auth=``) on a Unix socket,
    and on TCP at ``tcp_host()`` (an address of this node) once a caller on another host
    asks where it listens."""

    def __init__(self, target: Any, methods: frozenset[str], name: str, home: str | None = None,
                 tcp_host: Callable[[], str] | None = None):
        """``home``: the data directory this server's shard keeps, which names its socket
        folder (None: a fresh folder each start). ``tcp_host`` None: no TCP server."""
        self._target, self._name, self._home = target, name, home
        self._methods = {m: Binder(inspect.signature(getattr(target, m))) for m in methods}
        self._server: asyncio.base_events.Server | None = None
        self._dir: str | None = None
        self._tcp_host, self._key = tcp_host, new_key()
        self._tcp: asyncio.base_events.Server | None = None
        self._starting = asyncio.Lock()  # concurrent first asks start one server
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the shard's, once serve_here ran

    async def address(self, caller_host: str | None = None) -> tuple[str, Any]:
        """(host id, where to connect), starting the server on first use: the Unix
        socket's path for a caller on this host (``caller_host`` None or this host's id);
        for one on another host ("tcp", address, port, key) when this server has TCP,
        else None (Ray carries its calls)."""
        here = host_id()
        async with self._starting:  # starting yields to the loop: others wait, not start
            if caller_host is not None and caller_host != here:
                if self._tcp_host is None:
                    return here, None
                if self._tcp is None:
                    tls = ray_tls()
                    self._tcp = await asyncio.start_server(
                        self._serve_keyed, self._tcp_host(), 0, limit=1 << 20,
                        ssl=tls and tls.server,
                        ssl_handshake_timeout=HELLO_TIMEOUT_S if tls else None)
                address, port = self._tcp.sockets[0].getsockname()[:2]
                return here, ("tcp", address, port, self._key)
            if self._server is None:
                directory = socket_dir(self._home, self._name)
                path = os.path.join(directory, "s")
                if os.path.exists(path):
                    os.unlink(path)  # our previous incarnation's socket
                self._server = await asyncio.start_unix_server(self._serve, path,
                                                               limit=1 << 20)
                self._dir = directory
        return here, os.path.join(self._dir, "s")

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
        for server in (self._server, self._tcp):
            if server is not None:
                server.close()
        for writer in list(self._writers):
            writer.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve_peer(reader, _Peer(writer))

    async def _serve_keyed(self, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        """A TCP connection: its nonce sent, the caller's proof that it holds the key read
        within HELLO_TIMEOUT_S, before any frame of its."""
        nonce = os.urandom(NONCE_BYTES)
        writer.write(nonce)
        try:
            proof = await asyncio.wait_for(reader.readexactly(MAC_BYTES), HELLO_TIMEOUT_S)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            writer.close()
            return
        if not proves_key(proof, self._key, nonce):
            log.warning("%s channel: dropping a peer without the channel's key", self._name)
            writer.close()
            return
        await self._serve_peer(reader, _Peer(writer, self._key, nonce))

    async def _serve_peer(self, reader: asyncio.StreamReader, peer: "_Peer") -> None:
        writer = peer.writer
        self._writers.add(writer)
        try:
            for number in itertools.count():
                header = await reader.readexactly(HEADER.size)
                (size,) = HEADER.unpack(header)
                if size > MAX_FRAME_BYTES:
                    raise FrameError(f"a frame of {size} bytes")
                body = await reader.readexactly(size)
                if peer.key is not None:
                    mac = await reader.readexactly(MAC_BYTES)
                    if not checks(mac, peer.key, peer.nonce, number, REQUEST, header, body):
                        raise FrameError("a frame whose MAC does not check")
                task = asyncio.create_task(self._answer(body, peer))
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

    async def _answer(self, body: bytes, peer: "_Peer") -> None:
        try:
            call_id, method, args, kwargs, auth = decode_request(body)
        except FrameError as err:
            log.warning("%s channel: %s", self._name, err)
            peer.writer.close()
            return
        try:
            kwargs = self._bind(method, args, kwargs, auth)
            reply = encode_reply(call_id, await getattr(self._target, method)(*args, **kwargs))
        except Exception as err:
            reply = self._failure(call_id, method, err)
        if not peer.writer.is_closing():
            peer.send(reply)
            try:
                await peer.writer.drain()
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


class _Peer:
    """One connection's writer; keyed (TCP), its answers carry their MACs, numbered in
    the order they are written (on the event loop: one at a time)."""

    __slots__ = ("writer", "key", "nonce", "_answers")

    def __init__(self, writer: asyncio.StreamWriter, key: bytes | None = None,
                 nonce: bytes = b""):
        self.writer, self.key, self.nonce = writer, key, nonce
        self._answers = itertools.count()

    def send(self, reply: bytes) -> None:
        if self.key is None:
            self.writer.write(reply)
        else:
            self.writer.writelines(
                (reply, frame_mac(self.key, self.nonce, next(self._answers), ANSWER, reply)))
