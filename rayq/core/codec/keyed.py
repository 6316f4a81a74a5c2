"""Keyed frames: what a frame of the local channel's framing
(:mod:`rayq.core.codec.frames`) carries when its connection crosses the network.

The server (a follower's stream, a shard's TCP channel) makes a key of KEY_BYTES at
start and hands it out only through Ray, to a caller Ray let in. On each connection it
first sends a nonce of NONCE_BYTES; the client proves it holds the key (:func:`hello`)
within HELLO_TIMEOUT_S, before any frame of its is read, so a stranger cannot make the
server read or hold a frame it announces at the largest size. Then every frame, both
ways, is followed by a MAC of MAC_BYTES (:func:`frame_mac`): BLAKE2b keyed with the key,
over the nonce, the frame's direction and its number among that direction's frames on
the connection. A replayed frame, one out of order, of the other direction or of
another connection fails its MAC, and the reader drops the connection before it acts
on it. The frames are not encrypted, unless Ray's own TLS is on (:func:`ray_tls`):
then the connection is TLS with Ray's certificates, the keyed frames inside it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import ssl
import struct
from typing import NamedTuple

NONCE_BYTES = 16
MAC_BYTES = 16
KEY_BYTES = 32
HELLO_TIMEOUT_S = 10.0  # a peer that has not proved it holds the key by then is dropped
REQUEST, ANSWER, HELLO = 0, 1, 2  # a frame's direction: to the server, to the client
_NUMBER = struct.Struct(">QB")     # a frame's number in its direction, and the direction


def new_key() -> bytes:
    """A server's key (see the module docstring)."""
    return os.urandom(KEY_BYTES)


def frame_mac(key: bytes, nonce: bytes, number: int, direction: int, *frame: bytes) -> bytes:
    """The MAC that follows a frame (its parts, header included) on a keyed connection."""
    mac = hashlib.blake2b(key=key, digest_size=MAC_BYTES)
    mac.update(nonce)
    mac.update(_NUMBER.pack(number, direction))
    for part in frame:
        mac.update(part)
    return mac.digest()


def hello(key: bytes, nonce: bytes) -> bytes:
    """A client's proof that it holds ``key``: the MAC of the connection's nonce alone."""
    return frame_mac(key, nonce, 0, HELLO)


def proves_key(proof: bytes, key: bytes, nonce: bytes) -> bool:
    """Whether a client's first bytes are its :func:`hello` (compared in constant time)."""
    return checks(proof, key, nonce, 0, HELLO)


def read_exactly(connection, size: int, whole: bool = False) -> bytes | None:
    """``size`` bytes from a blocking connection (anything with ``recv``); None when the
    peer closed before the first (``whole``: an OSError then too, as when it closed
    partway)."""
    parts, got = [], 0
    while got < size:
        part = connection.recv(min(size - got, 1 << 20))
        if not part:
            if got or whole:
                raise ConnectionError("the connection closed inside a frame")
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def checks(mac: bytes, key: bytes, nonce: bytes, number: int, direction: int,
           *frame: bytes) -> bool:
    """Whether ``mac`` is the frame's (compared in constant time)."""
    return hmac.compare_digest(mac, frame_mac(key, nonce, number, direction, *frame))


# -- TLS: Ray's own, when Ray's TLS is on --------------------------------------------------
class Tls(NamedTuple):
    """The TLS contexts of a connection that crosses the network: this node's
    certificate and key, and the CA that signed every node's; each side proves itself
    to the other (mutual TLS), as Ray's own gRPC channels do."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def ray_tls() -> Tls | None:
    """Ray's TLS as its processes read it (RAY_USE_TLS, RAY_TLS_SERVER_CERT,
    RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT); None when it is off: the frames go in the
    clear, keyed. Raises OSError or ssl.SSLError when a file cannot be used."""
    if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true"):
        return None
    return _contexts(os.environ.get("RAY_TLS_SERVER_CERT", ""),
                     os.environ.get("RAY_TLS_SERVER_KEY", ""),
                     os.environ.get("RAY_TLS_CA_CERT", ""))


@functools.lru_cache(maxsize=4)
def _contexts(cert: str, key: str, ca: str) -> Tls:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False  # a node's certificate need not name its address: the CA
    for context in (server, client):  # and the key stand for it
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(cert, key)
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return Tls(server, client)
