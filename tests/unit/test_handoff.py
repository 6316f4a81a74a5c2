"""Handing an open HTTP connection to another server through a door (rayq.handoff): two
aiohttp servers in one loop stand for a replica and a shard, real sockets between them."""

import asyncio
import http.client
import socket

from aiohttp import web

from rayq import handoff
from rayq.errors import RuntimeFailure


async def _servers(tmp_path, door_path=None, replica_says=None):
    """(port of the "replica", its runner, the "shard"'s runner, its door); the replica
    answers "replica" and hands each connection through ``door_path`` (the shard's
    door when None) unless ``replica_says(request, door)`` answers instead; the shard
    answers "shard"."""
    async def shard_says(request):
        return web.Response(text="shard")
    shard = web.AppRunner(_app(shard_says))
    await shard.setup()
    door = handoff.Door(str(tmp_path / "door"), handoff.adopt_into(shard.server, 8))

    async def hand_every_one(request):
        await request.read()  # as the endpoint does before it answers
        response = web.Response(text="replica")
        if handoff.movable(request):
            await handoff.hand_off(request, response, door_path or door.path)
        return response
    async def delegate(request):
        return await replica_says(request, door)
    replica = web.AppRunner(_app(hand_every_one if replica_says is None else delegate))
    await replica.setup()
    site = web.SockSite(replica, _listening())
    await site.start()
    return site._sock.getsockname()[1], replica, shard, door


def _app(handler) -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def _close(replica, shard, door):
    door.close()
    await replica.cleanup()
    await shard.cleanup()


def _answers(port: int, count: int, actions=(), body_bytes: int = 2) -> list[str]:
    """The bodies of ``count`` requests on one keep-alive connection, one after another
    (the first ones with the X-Action headers ``actions``, the rest with "Send")."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    actions = list(actions) + ["Send"] * (count - len(actions))
    try:
        out = []
        for action in actions:
            connection.request("POST", "/", body=b"x" * body_bytes,
                               headers={"X-Action": action})
            out.append(connection.getresponse().read().decode())
        return out
    finally:
        connection.close()


def test_a_connection_moves_after_its_answer_and_its_next_request_reaches_the_shard(tmp_path):
    async def main():
        port, *servers = await _servers(tmp_path)
        try:
            return await asyncio.to_thread(_answers, port, 3)
        finally:
            await _close(*servers)
    assert asyncio.run(main()) == ["replica", "shard", "shard"]


def test_a_door_that_is_gone_leaves_the_connection_where_it_is(tmp_path):
    async def main():
        port, *servers = await _servers(tmp_path, door_path=str(tmp_path / "nobody"))
        try:
            return await asyncio.to_thread(_answers, port, 2)
        finally:
            await _close(*servers)
    assert asyncio.run(main()) == ["replica", "replica"]


def test_a_pipelined_request_already_read_keeps_the_connection_here(tmp_path):
    async def main():
        port, *servers = await _servers(tmp_path)
        try:
            return await asyncio.to_thread(_pipelined, port)
        finally:
            await _close(*servers)

    def _pipelined(port: int) -> bytes:
        request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request * 2)  # both in one write: the replica reads both at once
            got = b""
            while got.count(b"HTTP/1.1 200") < 2 or not got.endswith((b"replica", b"shard")):
                got += sock.recv(65536)
            return got
    answer = asyncio.run(main())
    assert answer.count(b"replica") == 2 and b"shard" not in answer


def _with_doors(tmp_path, ask, actions, count, home=lambda: 0):
    """The answers of one connection through a replica that weighs it with Doors."""
    async def main():
        doors = {}

        async def replica_says(request, door):
            await request.read()
            if "d" not in doors:
                doors["d"] = handoff.Doors(None, lambda shard: ask(shard, door.path),
                                           {"Send"}, "here")
            return await doors["d"].answer(request, web.Response(text="replica"),
                                           request.headers["X-Action"], home)
        port, *servers = await _servers(tmp_path, replica_says=replica_says)
        try:
            return await asyncio.to_thread(_answers, port, count, actions)
        finally:
            await _close(*servers)
    return asyncio.run(main())


def test_doors_move_a_connection_at_its_first_message_request_to_its_shard_here(tmp_path):
    asked = []

    async def ask(shard, path):
        asked.append(shard)
        return "here", path
    assert _with_doors(tmp_path, ask, ["List", "Send"], 3) == ["replica", "replica", "shard"]
    assert asked == [0]


def test_doors_leave_a_connection_whose_shard_is_elsewhere_down_or_spread(tmp_path):
    async def elsewhere(shard, path):
        return "another host", path

    async def down(shard, path):
        raise RuntimeFailure("restarting")
    assert _with_doors(tmp_path, elsewhere, [], 3) == ["replica"] * 3
    assert _with_doors(tmp_path, down, [], 3) == ["replica"] * 3
    assert _with_doors(tmp_path, elsewhere, [], 2, home=lambda: None) == ["replica"] * 2


def test_a_request_whose_body_was_not_read_keeps_its_connection_here(tmp_path):
    async def main():
        async def unread(request, door):
            response = web.Response(text="replica")
            if handoff.movable(request):
                await handoff.hand_off(request, response, door.path)
            return response
        port, *servers = await _servers(tmp_path, replica_says=unread)
        try:
            return await asyncio.to_thread(_answers, port, 3, [], 1 << 16)
        finally:
            await _close(*servers)
    assert asyncio.run(main()) == ["replica"] * 3
