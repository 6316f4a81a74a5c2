"""A real FollowerActor's stream (actors/replication/follower.py) on the test run's Ray:
the address it gives a leader on its host and one on another host, write sets applied
over each into its LMDB copy, and the key that keeps a stranger out. The test run's
Ray listens on 127.0.0.1 only, so the follower's TCP stream does too."""

import asyncio
import os
import stat

import pytest

from actors.replication.follower import FollowerRemote
from rayq.channel import host_id
from rayq.core.kit.kv import Write, pack_write_sets, peek
from rayq.core.replication.stream import StreamClient, StreamLost, new_key
from rayq.errors import StaleEpoch

ANSWER_S = 30.0  # bounds a hang only


@pytest.fixture(scope="module")
def follower(ray_session, tmp_path_factory):
    ray = ray_session
    path = str(tmp_path_factory.mktemp("follower") / "shard-0")
    actor = FollowerRemote.options(name="rayq-follower-0-test", namespace="rayq").remote(0, path)
    ray.get(actor.state.remote(), timeout=ANSWER_S)
    yield actor, path
    ray.get(actor.close.remote(), timeout=ANSWER_S)
    ray.kill(actor)


def one_set(n: int) -> bytes:
    return pack_write_sets([(Write("rows", f"row-{n}".encode(), f"value-{n}".encode()),)])


async def applied_over(address: tuple, *calls: tuple) -> list:
    stream = await StreamClient.connect(address, ANSWER_S)
    try:
        return [await stream.call("apply", *call) for call in calls]
    finally:
        stream.close()


def test_a_follower_takes_write_sets_over_its_unix_socket_from_a_leader_on_its_host(
        follower, ray_session):
    actor, path = follower
    kind, socket_path = ray_session.get(actor.stream.remote(host_id()), timeout=ANSWER_S)
    assert kind == "unix"
    folder = os.path.dirname(socket_path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and os.stat(folder).st_uid == os.getuid()
    assert asyncio.run(applied_over((kind, socket_path), (1, 1, one_set(1)))) == [1]
    assert ray_session.get(actor.state.remote()) == (1, 1)


def test_a_leader_on_another_host_gets_a_keyed_tcp_stream_and_a_stranger_is_refused(
        follower, ray_session):
    actor, path = follower
    before = ray_session.get(actor.applies.remote())
    address = ray_session.get(actor.stream.remote("another-host/another-boot"))
    kind, host, port, key = address
    assert (kind, host) == ("tcp", "127.0.0.1") and len(key) == 32
    epoch, seq = ray_session.get(actor.state.remote())
    assert asyncio.run(applied_over(address, (epoch, seq + 1, one_set(seq + 1)))) == [seq + 1]

    with pytest.raises(StreamLost):  # the right port, not the key
        asyncio.run(applied_over(("tcp", host, port, new_key()), (epoch, seq + 2, one_set(99))))
    with pytest.raises(StaleEpoch):  # a refusal comes back as itself over the stream
        asyncio.run(applied_over(address, (epoch - 1, seq + 2, one_set(98))))

    # and through Ray as before, the two ways one after the other
    ray_session.get(actor.apply.remote(epoch, seq + 2, one_set(seq + 2)))
    assert ray_session.get(actor.state.remote()) == (epoch, seq + 2)
    after = ray_session.get(actor.applies.remote())
    assert after["stream"] - before["stream"] == 2 and after["ray"] - before["ray"] == 1
    ray_session.get(actor.close.remote())
    for n in (seq + 1, seq + 2):
        assert peek(path, "rows", f"row-{n}".encode()) == f"value-{n}".encode()
    assert peek(path, "rows", b"row-99") is None
