"""The client's end of the channel (:mod:`rayq.core.codec.frames`).

A :class:`ShardLink` stands where a shard's actor handle stood. Its hot methods
(:data:`CHANNEL_METHODS`) go over the shard's Unix socket when the shard runs on
this host, over TCP to the shard's node, every frame keyed
(:mod:`rayq.core.codec.keyed`), when it runs on another host, and through Ray when
neither is open (a link made with ``use_channel`` False, a channel being set up, a
shard that cannot be reached); every other method is the handle's own.
``link.put.remote(...)`` returns a :class:`concurrent.futures.Future` on the
channel and an ``ObjectRef`` through Ray: :func:`rayq.remote.call` and
:func:`rayq.remote.resolve` take either.

One :class:`Channel` per shard and process, shared by every thread and client:
callers write frames under a lock, and one reader thread hands each reply to its
caller's future. When the socket breaks (the shard restarted or moved), every
unanswered call fails with :class:`ChannelLost`, which callers retry like a Ray
call that met a restart; the next call asks the shard (through Ray) where it
listens now.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import ssl
import threading
import time
import concurrent.futures
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from rayq.core.codec.frames import (HEADER, FrameError, FrameTooLarge, decode_reply,
                                    encode_request)
from rayq.core.codec.keyed import (ANSWER, MAC_BYTES, NONCE_BYTES, REQUEST, checks, frame_mac,
                                   hello, ray_tls, read_exactly)
from rayq.errors import RuntimeFailure

log = logging.getLogger("rayq.channel")

# The calls worth a socket: the ones every message makes. Ray carries the rest. Each is
# signed but end_many, the internal call by which consumers end their tasks
# (rayq.core.auth.operations.SHARD_INTERNAL): no other internal method goes on a socket.
CHANNEL_METHODS = frozenset({"put", "receive", "delete", "change_visibility", "end_many"})
RETRY_CONNECT_S = 5.0  # after a failed connect, use Ray this long before trying again
CONNECT_TIMEOUT_S = 2.0  # to open a TCP channel (connect, and the shard's nonce)
_lost_actors = [0]  # how many times a call of this process met a lost or restarting actor


def actor_lost() -> None:
    """A call met a lost or restarting actor: links resolve their shard again."""
    _lost_actors[0] += 1


def host_id() -> str:
    """This host, as one string: a client uses a shard's socket only on the same host."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class ChannelLost(RuntimeFailure):
    """Raised when the socket to a shard broke before the call was answered: whether
    the shard acted on it is unknown, as for a Ray call that met a restart."""


UNKNOWN_ACTOR = "Failed to submit task to actor"  # how Ray's submission to a gone actor fails


class BetweenPlaces(RuntimeFailure):
    """Raised when a link's actor runs under its name nowhere for a moment (a shard's
    leader or the manager moving to another node): the call is issued again, and given
    up as one that met a restart."""


Address = str | tuple  # a Unix socket's path, or ("tcp", address, port, key)


class Channel:
    """One socket to one shard, shared by the threads of this process: a Unix socket
    (``address`` its path), or TCP (("tcp", address, port, key)), every frame keyed."""

    def __init__(self, address: Address):
        self._key: bytes | None = None
        self._nonce = b""
        if isinstance(address, str):
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._sock.connect(address)
            except OSError:
                self._sock.close()
                raise
            self._io: socket.socket | _Tls = self._sock
        else:
            _, host, port, self._key = address
            self._sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                tls = ray_tls()
                self._io = self._sock if tls is None else _Tls(self._sock, tls.client)
                self._nonce = read_exactly(self._io, NONCE_BYTES, whole=True)
                self._io.sendall(hello(self._key, self._nonce))
                self._sock.settimeout(None)
            except OSError:  # ssl.SSLError among them
                self._sock.close()
                raise
        self._lock = threading.Lock()
        self._waiting: dict[int, Future] = {}
        self._ids = itertools.count()
        self._sent = itertools.count()  # keyed: the number of each frame sent, under the lock
        self.closed = False
        threading.Thread(target=self._read_forever, name="rayq-channel", daemon=True).start()

    def request(self, method: str, args: tuple, kwargs: dict) -> Future:
        """Send one call; its future holds the result or the error the shard raised."""
        auth = kwargs.get("auth")  # the caller's kwargs stay whole: Ray may carry them yet
        kwargs = {k: v for k, v in kwargs.items() if k != "auth"}
        future: Future = Future()
        call_id = next(self._ids)
        frame = encode_request(call_id, method, args, kwargs, auth)
        with self._lock:
            if self.closed:
                raise ChannelLost("the channel to the shard is closed")
            self._waiting[call_id] = future
            if self._key is not None:
                frame += frame_mac(self._key, self._nonce, next(self._sent), REQUEST, frame)
            try:
                self._io.sendall(frame)
            except OSError as err:
                self._waiting.pop(call_id, None)
                self._close_locked()
                raise ChannelLost(f"the channel to the shard broke: {err}") from err
        return future

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _read_forever(self) -> None:
        buffer = bytearray()
        mac_bytes = 0 if self._key is None else MAC_BYTES
        answers = itertools.count()
        try:
            while True:
                chunk = self._io.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= HEADER.size:
                    (size,) = HEADER.unpack_from(buffer)
                    end = HEADER.size + size
                    if len(buffer) < end + mac_bytes:
                        break
                    body = bytes(buffer[HEADER.size:end])
                    if mac_bytes and not checks(bytes(buffer[end:end + mac_bytes]), self._key,
                                                self._nonce, next(answers), ANSWER,
                                                bytes(buffer[:HEADER.size]), body):
                        raise FrameError("an answer whose MAC does not check")
                    call_id, ok, value = decode_reply(body)
                    del buffer[:end + mac_bytes]
                    with self._lock:
                        future = self._waiting.pop(call_id, None)
                    if future is not None:
                        (future.set_result if ok else future.set_exception)(value)
                    # an error raised from the future keeps the caller's frames in its
                    # traceback: hold nothing of it past this reply
                    del future, value
        except OSError:
            pass  # the socket broke, or close() shut it down
        except Exception:  # an answer that does not decode: nothing after it can be trusted
            log.exception("dropping a local channel over an answer it cannot read")
        finally:
            with self._lock:
                self._close_locked()
                waiting, self._waiting = self._waiting, {}
            for future in waiting.values():
                future.set_exception(ChannelLost("the shard closed the channel before answering"))
            self._sock.close()


class _Tls:
    """TLS over a connected socket for one writer at a time (the channel's lock) and
    its reader thread at once. An SSLSocket must not be read and written from two
    threads together; here the TLS state is an SSLObject on memory buffers, touched only
    under a lock of its own, and the socket is never waited on while that lock is held
    but to send what the TLS state just wrote (in the order it wrote it)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext):
        self._sock, self._lock = sock, threading.Lock()
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out)
        while True:  # the handshake, before the reader thread starts
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._sock.sendall(self._out.read())
                if not self._feed():
                    raise ConnectionError("the shard closed the channel in its TLS handshake")
        self._sock.sendall(self._out.read())

    def sendall(self, data: bytes) -> None:
        with self._lock:
            self._tls.write(data)
            self._sock.sendall(self._out.read())

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes of plaintext; b"" once the shard closed the connection."""
        while True:
            with self._lock:
                try:
                    data = self._tls.read(size)
                except ssl.SSLWantReadError:
                    data = None
                except ssl.SSLZeroReturnError:
                    return b""
                written = self._out.read()  # what reading made TLS say back (key updates)
                if written:
                    self._sock.sendall(written)
            if data is not None:
                return data
            if not self._feed():
                return b""

    def _feed(self) -> bool:
        raw = self._sock.recv(1 << 20)
        if not raw:
            return False
        with self._lock:
            self._in.write(raw)
        return True


class LocalChannel:
    """The channel to a shard in this very process (the SQS endpoint a shard runs for
    the connections handed to it): each call runs on the shard's event loop, with no
    socket and no copy of its arguments; its answer is a Future, or a task of that loop
    when the call was made on it."""

    closed = False

    def __init__(self, call: Callable[[str, tuple, dict, Any], Future]):
        self._call = call

    def request(self, method: str, args: tuple, kwargs: dict) -> Future:
        auth = kwargs.get("auth")
        return self._call(method, args, {k: v for k, v in kwargs.items() if k != "auth"}, auth)


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine) -> Future | asyncio.Task:
    """``coro`` run on ``loop``: a task of it when called there (no hand-off), else a
    Future of its result for this thread."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is loop:
        return loop.create_task(coro)
    return asyncio.run_coroutine_threadsafe(coro, loop)


_channels: dict[Address, Channel | LocalChannel] = {}  # address -> this process's channel to it
_channels_lock = threading.Lock()


def serve_in_process(path: str, call: Callable[[str, tuple, dict, Any], Future]) -> None:
    """Make this process's links to the shard listening at ``path`` call it through
    ``call(method, args, kwargs, auth)`` (the shard is in this process)."""
    with _channels_lock:
        _channels[path] = LocalChannel(call)


def _forget_channels_after_fork() -> None:
    """A forked child has the parent's sockets but not their reader threads: its answers
    would reach the parent's reader (a call id the parent also uses gets the child's
    answer). The child opens channels of its own; the parent's copies are only marked
    closed (links holding one then connect anew), never shut down: the socket is the
    parent's too."""
    global _channels, _channels_lock
    for channel in _channels.values():
        channel.closed = True
    _channels, _channels_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_channels_after_fork)


def _connect(address: Address) -> Channel | LocalChannel:
    """This process's channel to ``address``, opened if it has none. A Unix socket opens
    at once, under the lock; a TCP channel (connect, TLS, hello: up to seconds) outside
    it, so that no other link waits on it, and the first one stored is kept."""
    with _channels_lock:
        channel = _channels.get(address)
        if channel is not None and not channel.closed:
            return channel
        if isinstance(address, str):
            channel = _channels[address] = Channel(address)
            return channel
    opened = Channel(address)
    with _channels_lock:
        channel = _channels.get(address)
        if channel is None or channel.closed:
            channel = _channels[address] = opened
    if channel is not opened:
        opened.close()
    return channel


class _Method:
    __slots__ = ("_link", "_name")

    def __init__(self, link: "ShardLink", name: str):
        self._link, self._name = link, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.request(self._name, args, kwargs)


class _RayMethod:
    """Any other method of a link's actor, always through Ray (``options`` as Ray's)."""

    __slots__ = ("_link", "_name", "_options")

    def __init__(self, link: "ShardLink", name: str, options: dict | None = None):
        self._link, self._name, self._options = link, name, options or {}

    def options(self, **options: Any) -> "_RayMethod":
        return _RayMethod(self._link, self._name, {**self._options, **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        def submit(handle):
            method = getattr(handle, self._name)
            return (method.options(**self._options) if self._options else method).remote(
                *args, **kwargs)
        return self._link._submitted(submit)


class ShardLink:
    """A shard's actor handle, with its hot calls over the local channel when it is on
    this host (``use_channel``); pickles as a plain link that connects again. Made
    with no ``handle``, it looks the shard up (``resolve``) at its first use."""

    def __init__(self, handle: Any, use_channel: bool = True,
                 resolve: Callable[[], Any] | None = None):
        self._handle, self._resolve = handle, resolve
        self._use_channel = self._wants_channel = use_channel
        self._path: Address | None = None
        self._asking: Future | None = None  # the shard's answer to "where do you listen?"
        self._open: Channel | None = None
        self._aside = threading.Lock()  # held while a TCP channel is opened aside
        self._retry_at = 0.0
        self._resolved_at = _lost_actors[0]

    def __reduce__(self):
        return ShardLink, (self._handle, self._wants_channel, self._resolve)

    def __getattr__(self, name: str) -> Any:
        if name in CHANNEL_METHODS:
            return _Method(self, name)
        if name.startswith("_"):
            raise AttributeError(name)
        return _RayMethod(self, name)

    @property
    def handle(self) -> Any:
        """The shard's actor handle: looked up again (``resolve``) once after calls of
        this process met a lost actor, in case the shard's leader moved."""
        if self._resolve is not None and (self._handle is None or
                                          self._resolved_at != _lost_actors[0]):
            self._resolved_at = _lost_actors[0]
            try:
                fresh = self._resolve()
            except Exception as err:  # not running yet: the old handle until the next loss
                if self._handle is None:
                    raise BetweenPlaces(str(err)) from err
                return self._handle
            if self._handle is None or fresh._actor_id != self._handle._actor_id:
                self._handle, self._use_channel = fresh, self._wants_channel
                self._path, self._open, self._retry_at = None, None, 0.0
        return self._handle

    def in_process(self) -> bool:
        """Whether its calls run in this very process (the shard's own SQS endpoint)."""
        return isinstance(self._channel(), LocalChannel)

    def request(self, method: str, args: tuple, kwargs: dict) -> Any:
        """The call's future over the channel, or its ObjectRef through Ray."""
        channel = self._channel()
        if channel is not None:
            try:
                return channel.request(method, args, kwargs)
            except FrameTooLarge:
                pass  # too large for a frame: Ray carries it
        return self._submitted(lambda handle: getattr(handle, method).remote(*args, **kwargs))

    def _submitted(self, submit: Callable[[Any], Any]) -> Any:
        """``submit(handle)``: a call issued to this link's actor. An actor Ray no longer
        knows (killed and started anew under its name: its leader moved) fails the
        submission itself with a plain Exception; that counts as a lost actor, so the
        call is issued again once the link looked its shard up anew."""
        try:
            return submit(self.handle)
        except Exception as err:
            if not str(err).startswith(UNKNOWN_ACTOR):
                raise
            actor_lost()
            raise BetweenPlaces(str(err)) from err

    def _channel(self) -> Channel | None:
        channel = self._open  # the hot path: the channel this link used last, still up
        if channel is not None and not channel.closed:
            return channel
        if not self._use_channel or time.monotonic() < self._retry_at:
            return None
        path = self._path  # read once: another thread asking anew sets it to None
        if path is None or _lost(path):
            path = None if self._asking is not None else self._ask()
            if path is None:
                return None  # Ray carries this call; the address comes in the background
        if not isinstance(path, str):
            self._connect_aside(path)  # a TCP connect never holds up a caller
            return None
        return self._connect(path)

    def _connect(self, address: Address) -> Channel | None:
        try:
            self._open = _connect(address)
            return self._open
        except OSError:
            self._path, self._retry_at = None, time.monotonic() + RETRY_CONNECT_S
            return None

    @property
    def _connecting(self) -> bool:
        """Whether a TCP channel is being opened aside."""
        return self._aside.locked()

    def _connect_aside(self, address: Address) -> None:
        """Open the TCP channel on a thread of its own (once at a time): Ray carries the
        calls meanwhile, and whenever the shard's port cannot be reached (tried again
        every RETRY_CONNECT_S)."""
        if not self._aside.acquire(blocking=False):
            return  # being opened

        def connect() -> None:
            try:
                self._connect(address)
            finally:
                self._aside.release()
        threading.Thread(target=connect, name="rayq-channel-connect", daemon=True).start()

    def _ask(self) -> Address | None:
        """Ask the shard where its channel listens for this host. Outside an event loop,
        wait for the answer (the address, None if not usable); inside one (a consumer)
        never block the loop: the answer arrives in the background and later calls use
        it."""
        self._path = None
        asking = self._asking = self._submitted(
            lambda handle: handle.channel.remote(host_id())).future()
        if _in_event_loop():
            asking.add_done_callback(self._answered)
            return None
        concurrent.futures.wait([asking])
        return self._answered(asking)

    def _answered(self, future: Future) -> Address | None:
        path = None
        try:
            host, found = future.result()
            if found is not None and (host == host_id()) == isinstance(found, str):
                path = self._path = found  # its socket on this host, else its TCP port
            else:
                self._use_channel = False  # no channel for this caller: Ray carries its calls
        except Exception:
            self._retry_at = time.monotonic() + RETRY_CONNECT_S
        self._asking = None
        return path


def _lost(path: Address) -> bool:
    """Whether this process's channel to ``path`` broke (the shard restarted or moved)."""
    channel = _channels.get(path)
    return channel is not None and channel.closed


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False
