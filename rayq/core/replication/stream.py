"""The leader's stream to a follower: its write sets over one socket, not a Ray call each.

A Ray actor call from a leader to its follower took 2.2 ms of round trip (median, with
replicas=2 under load on the 2-core machine) around an apply of 0.7 ms; every
acknowledgement of a replicated write waits for one. So a leader ships its write sets
over a socket the follower listens on: a Unix socket in a private folder when both run
on one host, TCP on the follower node's address otherwise. Everything else a leader
asks of its follower (its state, a fence, a seed) still goes through Ray, and so does
an apply too large for a frame.

Frames are the local channel's (:mod:`rayq.core.codec.frames`), keyed
(:mod:`rayq.core.codec.keyed`) when the stream crosses the network: the follower makes
its stream key at start and hands it out only through Ray, to a caller Ray let in; with
Ray's TLS on, inside TLS with Ray's certificates. A
Unix socket needs no MAC: only the user that runs Ray may enter its folder (mode 0700),
as only it may read the LMDB files.

One call at a time per stream: a leader's sender for a follower waits for each apply
(:class:`rayq.core.replication.shipping.Shipper`). A call that fails, is cancelled or
times out closes the stream: whether the follower applied it is unknown, and the next
answer on that socket could be its.

No Ray here: the follower's side is threads (it is a threaded actor), the leader's is
asyncio (a shard's event loop).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from rayq.core.codec.frames import (HEADER, MAX_FRAME_BYTES, FrameError, decode_reply,
                                    decode_request, encode_failure, encode_reply,
                                    encode_request)
from rayq.core.codec.keyed import (ANSWER, HELLO, HELLO_TIMEOUT_S, MAC_BYTES, NONCE_BYTES,
                                   REQUEST, checks, frame_mac, hello, new_key, proves_key,
                                   ray_tls, read_exactly)
from rayq.errors import RuntimeFailure

log = logging.getLogger("rayq.stream")

TO_FOLLOWER, TO_LEADER = REQUEST, ANSWER


class StreamLost(RuntimeFailure):
    """Raised when a follower's stream broke, was closed or answered something it cannot
    read: whether the follower applied the call is unknown (as for a Ray call that met
    a lost actor)."""


# -- the follower's side: threads ---------------------------------------------------------
class StreamServer:
    """Serves ``handle(method, args)`` to the leaders that connect, each connection on a
    thread of its own, one call after the other. ``key`` None: a Unix socket, no MAC."""

    def __init__(self, listener: socket.socket, handle: Callable[[str, list], Any],
                 key: bytes | None, name: str):
        self._listener, self._handle, self._key, self._name = listener, handle, key, name
        self._tls = ray_tls() if key is not None else None  # over the network: Ray's TLS
        self.path: str | None = None  # a Unix socket's
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept_forever, name=f"{name}-accept", daemon=True).start()

    @classmethod
    def unix(cls, path: str, handle: Callable[[str, list], Any], name: str) -> "StreamServer":
        """Listening at ``path`` (its folder must be private: see the module docstring)."""
        if os.path.exists(path):
            os.unlink(path)  # a previous incarnation's socket
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(16)
        server = cls(listener, handle, None, name)
        server.path = path
        return server

    @classmethod
    def tcp(cls, host: str, handle: Callable[[str, list], Any], key: bytes,
            name: str) -> "StreamServer":
        """Listening on ``host``, a port the system picks (:attr:`port`), every frame MAC'd."""
        listener = socket.create_server((host, 0), backlog=16)
        return cls(listener, handle, key, name)

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def close(self) -> None:
        """Stop listening and drop every connection (a leader's call under way fails
        with StreamLost there)."""
        with self._lock:
            self.closed = True
            connections, self._connections = self._connections, set()
        _shut(self._listener)
        for connection in connections:
            _shut(connection)

    def _accept_forever(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self.closed:
                    _shut(connection)
                    return
                self._connections.add(connection)
            threading.Thread(target=self._serve, args=(connection,), name=f"{self._name}-conn",
                             daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        nonce = os.urandom(NONCE_BYTES)
        try:
            if self._tls is not None:  # this thread alone reads and writes it: no race
                connection = self._wrapped(connection)
            connection.sendall(nonce)
            if self._key is not None:
                self._greet(connection, nonce)
            for number in itertools.count():
                frame = self._read_frame(connection, nonce, number)
                if frame is None:
                    return
                reply = self._answer(frame)
                if self._key is not None:
                    reply += frame_mac(self._key, nonce, number, TO_LEADER, reply)
                connection.sendall(reply)
        except OSError:
            pass  # the leader went away, or close() dropped the connection
        except FrameError as err:
            log.warning("%s: dropping a connection: %s", self._name, err)
        finally:
            with self._lock:
                self._connections.discard(connection)
            _shut(connection)

    def _wrapped(self, connection: socket.socket) -> socket.socket:
        """The connection in TLS, its handshake done within HELLO_TIMEOUT_S; it stands
        for the plain socket (whose descriptor it took) among the connections."""
        connection.settimeout(HELLO_TIMEOUT_S)
        with self._lock:
            self._connections.discard(connection)
        wrapped = self._tls.server.wrap_socket(connection, server_side=True,
                                               do_handshake_on_connect=False)
        with self._lock:
            if not self.closed:
                self._connections.add(wrapped)
        if self.closed:
            _shut(wrapped)
            raise OSError("the stream server closed")
        try:
            wrapped.do_handshake()
        except OSError:  # ssl.SSLError among them: a peer without Ray's certificates
            with self._lock:
                self._connections.discard(wrapped)
            _shut(wrapped)
            raise
        wrapped.settimeout(None)
        return wrapped

    def _greet(self, connection: socket.socket, nonce: bytes) -> None:
        """The leader's proof that it holds the key, before any frame is read."""
        connection.settimeout(HELLO_TIMEOUT_S)
        proof = read_exactly(connection, MAC_BYTES, whole=True)
        if not proves_key(proof, self._key, nonce):
            raise FrameError("a peer without the stream's key")
        connection.settimeout(None)

    def _read_frame(self, connection: socket.socket, nonce: bytes, number: int) -> bytes | None:
        """The next request frame's body, its MAC checked; None at the end."""
        header = read_exactly(connection, HEADER.size)
        if header is None:
            return None
        (size,) = HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise FrameError(f"a frame of {size} bytes")
        body = read_exactly(connection, size, whole=True)
        if self._key is not None:
            mac = read_exactly(connection, MAC_BYTES, whole=True)
            if not checks(mac, self._key, nonce, number, TO_FOLLOWER, header, body):
                raise FrameError("a frame whose MAC does not check")
        return body

    def _answer(self, body: bytes) -> bytes:
        call_id, method, args, _, _ = decode_request(body)
        try:
            return encode_reply(call_id, self._handle(method, args))
        except Exception as err:  # the leader learns of it as from a Ray call
            return encode_failure(call_id, err)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


# -- the leader's side: asyncio -----------------------------------------------------------
class StreamClient:
    """A leader's connection to one follower's stream, on the leader's event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 nonce: bytes, key: bytes | None):
        self._reader, self._writer, self._nonce, self._key = reader, writer, nonce, key
        self._numbers = itertools.count()
        self.closed = False

    @classmethod
    async def connect(cls, address: tuple, timeout_s: float) -> "StreamClient":
        """``address``: ("unix", path) or ("tcp", host, port, key), as the follower gave it.
        Raises OSError (or TimeoutError) when it cannot connect."""
        if address[0] == "unix":
            opening, key = asyncio.open_unix_connection(address[1], limit=1 << 20), None
        else:
            _, host, port, key = address
            tls = ray_tls()
            opening = asyncio.open_connection(host, port, limit=1 << 20,
                                              ssl=tls and tls.client)
        reader, writer = await asyncio.wait_for(opening, timeout_s)
        try:
            nonce = await asyncio.wait_for(reader.readexactly(NONCE_BYTES), timeout_s)
        except BaseException:
            writer.close()
            raise
        if key is not None:
            writer.write(hello(key, nonce))
        return cls(reader, writer, nonce, key)

    async def call(self, method: str, *args: Any) -> Any:
        """The follower's answer to ``method(*args)``, or the error it raised. Raises
        FrameTooLarge before anything is sent (Ray carries such a call), StreamLost when
        the stream broke; any failure, a cancellation included, closes the stream."""
        frame = encode_request(0, method, args, {}, None)
        if self.closed:
            raise StreamLost("the stream to the follower is closed")
        number = next(self._numbers)
        try:
            self._writer.write(frame)
            if self._key is not None:
                self._writer.write(frame_mac(self._key, self._nonce, number, TO_FOLLOWER, frame))
            header = await self._reader.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"an answer of {size} bytes")
            body = await self._reader.readexactly(size)
            if self._key is not None:
                mac = await self._reader.readexactly(MAC_BYTES)
                if not checks(mac, self._key, self._nonce, number, TO_LEADER, header, body):
                    raise FrameError("an answer whose MAC does not check")
            _, ok, value = decode_reply(body)
        except Exception as err:  # a broken socket, or an answer it cannot read
            self.close()
            raise StreamLost(f"the stream to the follower broke: {err!r}") from err
        except BaseException:  # cancelled (timed out): its answer may still come
            self.close()
            raise
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()
