"""A leader's stream to its follower without Ray: a StreamServer on its threads (as a
follower's), real StreamClients on an event loop (as a leader's), over a Unix socket
and over TCP on 127.0.0.1 with its frames MAC'd."""

import asyncio
import os
import socket
import tempfile
import threading

import pytest

from rayq.core.codec.frames import HEADER, MAX_FRAME_BYTES, FrameTooLarge, encode_request
from rayq.core.replication.stream import (HELLO, MAC_BYTES, NONCE_BYTES, TO_FOLLOWER,
                                          StreamClient, StreamLost, StreamServer, frame_mac,
                                          new_key)
from rayq.errors import StaleEpoch
from tests.certs import ray_tls_on

ANSWER_S = 10.0  # bounds a hang only: every call here answers at once or is released


class FakeFollower:
    """Applies by recording; refuses an old epoch as a replica does."""

    def __init__(self):
        self.applied: list = []
        self.epoch = 1
        self.hold = threading.Event()
        self.hold.set()

    def handle(self, method: str, args: list):
        assert method == "apply"
        epoch, first_seq, packed = args
        if epoch < self.epoch:
            raise StaleEpoch(f"epoch {epoch} refused")
        self.hold.wait(ANSWER_S)
        self.applied.append(packed)
        return len(self.applied)


@pytest.fixture
def follower():
    return FakeFollower()


@pytest.fixture
def unix_server(follower):
    folder = tempfile.mkdtemp()
    os.chmod(folder, 0o700)
    server = StreamServer.unix(os.path.join(folder, "s"), follower.handle, "test")
    yield server
    server.close()


@pytest.fixture
def tcp_server(follower):
    key = new_key()
    server = StreamServer.tcp("127.0.0.1", follower.handle, key, "test")
    server.key = key
    yield server
    server.close()


def tcp_address(server, key=None):
    return ("tcp", "127.0.0.1", server.port, server.key if key is None else key)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, ANSWER_S))


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_write_sets_apply_in_order_and_a_followers_refusal_comes_back_as_itself(
        kind, follower, request):
    server = request.getfixturevalue(f"{kind}_server")
    address = ("unix", server.path) if kind == "unix" else tcp_address(server)

    async def talk():
        stream = await StreamClient.connect(address, ANSWER_S)
        assert await stream.call("apply", 1, 1, b"one") == 1
        assert await stream.call("apply", 1, 2, b"two" * 100_000) == 2
        follower.epoch = 2
        with pytest.raises(StaleEpoch):
            await stream.call("apply", 1, 3, b"three")
        return stream
    stream = run(talk())
    assert follower.applied == [b"one", b"two" * 100_000]
    assert stream.closed is False  # a refusal is an answer: the stream stays


def test_a_frame_too_large_is_refused_before_anything_is_sent(unix_server, follower):
    async def talk():
        stream = await StreamClient.connect(("unix", unix_server.path), ANSWER_S)
        with pytest.raises(FrameTooLarge):
            await stream.call("apply", 1, 1, b"x" * (MAX_FRAME_BYTES + 1))
        return await stream.call("apply", 1, 1, b"small")
    assert run(talk()) == 1
    assert follower.applied == [b"small"]


def test_a_closed_follower_fails_the_call_under_way_with_stream_lost(unix_server, follower):
    follower.hold.clear()

    async def talk():
        stream = await StreamClient.connect(("unix", unix_server.path), ANSWER_S)
        call = asyncio.ensure_future(stream.call("apply", 1, 1, b"one"))
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, unix_server.close)
        try:
            with pytest.raises(StreamLost):
                await call
        finally:
            follower.hold.set()
        assert stream.closed
        with pytest.raises(StreamLost):
            await stream.call("apply", 1, 1, b"again")
    run(talk())


def test_a_cancelled_call_closes_the_stream_since_its_answer_may_still_come(
        unix_server, follower):
    follower.hold.clear()

    async def talk():
        stream = await StreamClient.connect(("unix", unix_server.path), ANSWER_S)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(stream.call("apply", 1, 1, b"one"), 0.05)
        assert stream.closed
        follower.hold.set()
        fresh = await StreamClient.connect(("unix", unix_server.path), ANSWER_S)
        return await fresh.call("apply", 1, 2, b"two")
    assert run(talk()) == 2  # the cancelled call was applied after all: the next follows it


def test_a_leader_without_the_key_is_dropped_before_its_frame_is_read(tcp_server, follower):
    async def talk():
        stream = await StreamClient.connect(tcp_address(tcp_server, key=new_key()), ANSWER_S)
        with pytest.raises(StreamLost):
            await stream.call("apply", 1, 1, b"forged")
    run(talk())
    assert follower.applied == []
    # a stranger that claims a frame of MAX_FRAME_BYTES is dropped at its first bytes:
    # nothing of that size is read or held for it
    with socket.create_connection(("127.0.0.1", tcp_server.port), timeout=ANSWER_S) as sock:
        sock.recv(NONCE_BYTES, socket.MSG_WAITALL)
        sock.sendall(HEADER.pack(MAX_FRAME_BYTES) + b"\0" * (MAC_BYTES - HEADER.size))
        assert sock.recv(1 << 16) == b""


def raw_frames(server, key: bytes, frames: list[bytes], nonce: bytes | None = None) -> bytes:
    """Send ``frames`` on a fresh TCP connection, each MAC'd for ``nonce`` (None: the
    connection's own) and numbered from 0; what came back."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=ANSWER_S) as sock:
        own = sock.recv(NONCE_BYTES, socket.MSG_WAITALL)
        sock.sendall(frame_mac(key, own, 0, HELLO, b""))
        for number, frame in enumerate(frames):
            sock.sendall(frame + frame_mac(key, own if nonce is None else nonce, number,
                                           TO_FOLLOWER, frame))
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
        return answer


def test_a_frame_replayed_on_another_connection_or_out_of_order_fails_its_mac(
        tcp_server, follower):
    one = encode_request(0, "apply", (1, 1, b"one"), {}, None)
    two = encode_request(0, "apply", (1, 2, b"two"), {}, None)
    answered = raw_frames(tcp_server, tcp_server.key, [one])
    assert len(answered) > HEADER.size + MAC_BYTES and follower.applied == [b"one"]
    # the same frame MAC'd for the first connection's nonce: not this one's
    assert raw_frames(tcp_server, tcp_server.key, [two], nonce=b"\0" * NONCE_BYTES) == b""
    # the first frame of a connection MAC'd as its second: out of order
    with socket.create_connection(("127.0.0.1", tcp_server.port), timeout=ANSWER_S) as sock:
        nonce = sock.recv(NONCE_BYTES, socket.MSG_WAITALL)
        sock.sendall(frame_mac(tcp_server.key, nonce, 0, HELLO, b""))
        sock.sendall(two + frame_mac(tcp_server.key, nonce, 1, TO_FOLLOWER, two))
        assert sock.recv(1 << 16) == b""
    assert follower.applied == [b"one"]


def test_with_rays_tls_on_the_tcp_stream_is_tls_and_a_plain_peer_gets_nothing(
        follower, monkeypatch, tmp_path):
    from rayq.core.replication import stream

    ray_tls_on(monkeypatch, tmp_path)
    monkeypatch.setattr(stream, "HELLO_TIMEOUT_S", 0.5)  # a silent peer is dropped sooner
    key = new_key()
    server = StreamServer.tcp("127.0.0.1", follower.handle, key, "tls")
    try:
        async def talk():
            stream = await StreamClient.connect(("tcp", "127.0.0.1", server.port, key), ANSWER_S)
            got = [await stream.call("apply", 1, n, b"x" * 100_000) for n in range(3)]
            stream.close()
            return got
        assert run(talk()) == [1, 2, 3]
        with socket.create_connection(("127.0.0.1", server.port), timeout=ANSWER_S) as sock:
            sock.sendall(b"\x00" * 64)  # not a TLS hello: no nonce, nothing read, dropped
            assert sock.recv(1 << 16) == b""
        monkeypatch.setenv("RAY_USE_TLS", "0")  # a leader without Ray's TLS: refused

        async def plain():
            stream = await StreamClient.connect(("tcp", "127.0.0.1", server.port, key), ANSWER_S)
            await stream.call("apply", 1, 9, b"plain")
        with pytest.raises((OSError, StreamLost, asyncio.IncompleteReadError)):
            run(plain())
    finally:
        server.close()
    assert len(follower.applied) == 3
