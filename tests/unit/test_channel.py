"""The local channel without Ray: a ChannelServer for a small async target on an event
loop in a background thread (as a shard's loop), and real rayq.channel Channels and
ShardLinks talking to its Unix socket."""

import asyncio
import concurrent.futures
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import pytest

from actors.channel import ChannelServer
from rayq.channel import (CHANNEL_METHODS, RETRY_CONNECT_S, BetweenPlaces, Channel, ChannelLost,
                          ShardLink, _channels, host_id)
from rayq.core.auth.accounts import Signature
from rayq.core.auth.operations import SHARD_INTERNAL
from rayq.core.codec import frames, keyed
from rayq.core.codec.frames import HEADER, MAX_FRAME_BYTES, encode_request
from rayq.errors import InvalidMessage, QueueDisabled, ReceiptInvalid, RuntimeFailure
from tests.certs import ray_tls_on

ROOT = Path(__file__).resolve().parents[2]
ANSWER_S = 10.0  # bounds a hang only: every call here answers at once or is released
SIGNED = Signature("acme", "orders", "put", 1_700_000_000.0, "ab" * 16, "cd" * 32)


class FakeShard:
    """A target with the shapes of a shard's served methods: async, ``auth=`` last."""

    def __init__(self):
        self.parked: dict[str, asyncio.Event] = {}
        self.ran: list[str] = []
        self.auths: list = []  # what each put came with

    async def echo(self, value, extra=None, auth=None):
        self.ran.append("echo")
        return [value, extra, None if auth is None else [auth.account, auth.mac]]

    async def put(self, subqueue, batch, auth=None):  # one of CHANNEL_METHODS, for links
        self.auths.append(auth)
        return [f"{subqueue}:{len(batch)}"]

    async def park(self, key, auth=None):
        """Answers once the test releases ``key``: a long poll."""
        await self.parked.setdefault(key, asyncio.Event()).wait()
        return key

    def release(self, key):
        self.parked.setdefault(key, asyncio.Event()).set()

    async def refuse(self, receipts, auth=None):
        raise ReceiptInvalid(f"{len(receipts)} stale", tuple(receipts))

    async def crash(self, auth=None):
        raise KeyError("the shard's own bug")

    async def unpicklable(self, auth=None):
        error = QueueDisabled("holds a lock")
        error.lock = threading.Lock()
        raise error

    async def results(self, auth=None):  # as end_many: a value or a RayqError per call
        return [None, "receipt", QueueDisabled("retired")]

    async def unsigned(self, value):  # no auth parameter, as end_many
        return value

    async def hidden(self, auth=None):  # a method the channel does not serve
        self.ran.append("hidden")


SERVED = frozenset({"echo", "put", "park", "refuse", "crash", "unpicklable", "results",
                    "unsigned"})


def wait_until(observe, what: str):
    """Poll ``observe()`` until truthy; the deadline only bounds a hang."""
    deadline = time.monotonic() + ANSWER_S
    while not (seen := observe()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)
    return seen


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="shard-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(ANSWER_S)
    loop.close()


def on_loop(loop, coro):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(ANSWER_S)


async def _close(server):
    server.close()


@pytest.fixture
def serve(loop):
    """serve() -> (target, server, socket path): a fresh server (a fresh directory)."""
    started = []

    def start():
        target = FakeShard()
        server = ChannelServer(target, SERVED, "test")
        host, path = on_loop(loop, server.address())
        assert host == host_id()
        started.append(server)
        return target, server, path

    yield start
    for server in started:
        on_loop(loop, _close(server))


@pytest.fixture
def served(serve):
    return serve()


@pytest.fixture
def channel(served):
    channel = Channel(served[2])
    yield channel
    channel.close()


def ask(channel, method, *args, **kwargs):
    return channel.request(method, args, kwargs).result(ANSWER_S)


# -- answers ------------------------------------------------------------------------------
def test_a_call_returns_the_targets_result(channel):
    answer = ask(channel, "echo", b"\x00bytes", extra=[1, [2, None]])
    assert answer == [b"\x00bytes", [1, [2, None]], None]


def test_a_signature_reaches_the_target_as_auth(channel):
    assert ask(channel, "echo", "v", auth=SIGNED) == ["v", None, ["acme", SIGNED.mac]]


def test_concurrent_calls_from_many_threads_each_get_their_own_answer(channel):
    def caller(thread: int) -> list:
        return [ask(channel, "echo", [thread, i], extra=f"{thread}/{i}") for i in range(40)]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(caller, range(8)))
    assert answers == [[[[t, i], f"{t}/{i}", None] for i in range(40)] for t in range(8)]


def test_a_parked_call_does_not_hold_up_the_calls_behind_it(loop, served, channel):
    target = served[0]
    parked = channel.request("park", ("long poll",), {})
    wait_until(lambda: "long poll" in target.parked, "the call to park")
    assert ask(channel, "echo", "behind") == ["behind", None, None]
    assert not parked.done()
    loop.call_soon_threadsafe(target.release, "long poll")
    assert parked.result(ANSWER_S) == "long poll"


def test_a_rayq_error_comes_back_as_itself(channel):
    with pytest.raises(ReceiptInvalid) as raised:
        ask(channel, "refuse", ["r1", "r2"])
    assert raised.value.receipts == ("r1", "r2")


def test_rayq_errors_inside_a_result_come_back_as_themselves(channel):
    none, receipt, error = ask(channel, "results")
    assert (none, receipt) == (None, "receipt")
    assert isinstance(error, QueueDisabled) and str(error) == "retired"


@pytest.mark.parametrize("method, args, kwargs", [
    ("hidden", (), {}),                  # the target has it; the channel does not serve it
    ("__init__", (), {}),
    ("nothing", (), {}),
    ("echo", (), {}),                    # a required argument missing
    ("echo", (1, 2, 3, 4), {}),          # too many
    ("echo", (1,), {"colour": "red"}),   # an unknown keyword
    ("echo", (1, None, ["acme", "q"]), {}),  # auth passed as an argument, not the frame's
])
def test_an_unserved_method_or_bad_arguments_raise_invalid_message(served, channel, method,
                                                                   args, kwargs):
    with pytest.raises(InvalidMessage):
        ask(channel, method, *args, **kwargs)
    assert served[0].ran == []


def test_a_signature_for_a_method_without_auth_raises_invalid_message(channel):
    with pytest.raises(InvalidMessage):
        ask(channel, "unsigned", 1, auth=SIGNED)
    assert ask(channel, "unsigned", 1) == 1


def test_auth_given_twice_raises_invalid_message(served, channel):
    with pytest.raises(InvalidMessage):
        ask(channel, "echo", 1, None, "forged", auth=SIGNED)
    assert served[0].ran == []


def test_auth_as_a_keyword_argument_is_refused(served):
    # Channel.request moves auth= to the frame's auth field; a stranger writes frames
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(served[2])
        sock.sendall(raw_request([7, "echo", [1], {"auth": "admin"}, None]))
        reply = read_reply(sock)
    assert reply[:2] == [7, 1] and isinstance(pickle.loads(reply[2]), InvalidMessage)


def test_a_shards_channel_refuses_each_of_its_internal_methods(loop):
    ran = []

    def method(name):
        async def run(self, *args, auth=None):
            ran.append(name)
        return run
    # a target with every internal method of a shard, served as a shard serves its own
    names = SHARD_INTERNAL | CHANNEL_METHODS
    surface = type("Surface", (), {name: method(name) for name in names})
    server = ChannelServer(surface(), CHANNEL_METHODS, "test")
    channel = Channel(on_loop(loop, server.address())[1])
    try:
        for name in sorted(SHARD_INTERNAL):
            with pytest.raises(InvalidMessage, match="not served"):
                ask(channel, name)
        ask(channel, "end_many", [])  # a served one runs
    finally:
        channel.close()
        on_loop(loop, _close(server))
    assert ran == ["end_many"]


def test_a_failure_of_the_target_itself_raises_runtime_failure(channel):
    with pytest.raises(RuntimeFailure, match="the shard's own bug"):
        ask(channel, "crash")
    assert ask(channel, "echo", "still serving")[0] == "still serving"


def test_a_rayq_error_that_cannot_be_pickled_still_answers_as_runtime_failure(channel):
    with pytest.raises(RuntimeFailure, match="holds a lock"):
        ask(channel, "unpicklable")


def test_a_call_that_cannot_travel_raises_invalid_message_before_it_is_sent(channel):
    with pytest.raises(InvalidMessage):
        channel.request("echo", (object(),), {})
    assert ask(channel, "echo", 1)[0] == 1


# -- the socket ------------------------------------------------------------------------------
def test_the_socket_lives_in_a_directory_only_its_user_can_enter(served):
    directory = os.path.dirname(served[2])
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert os.stat(directory).st_uid == os.getuid()
    assert stat.S_ISSOCK(os.stat(served[2]).st_mode)


def test_concurrent_first_asks_start_one_server_and_close_removes_it(loop, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = ChannelServer(FakeShard(), SERVED, "race")

    async def ask_three_at_once():
        return await asyncio.gather(*(server.address() for _ in range(3)))

    addresses = on_loop(loop, ask_three_at_once())
    assert len(set(addresses)) == 1
    assert len(list(tmp_path.iterdir())) == 1
    on_loop(loop, _close(server))
    assert list(tmp_path.iterdir()) == []


def raw_request(payload) -> bytes:
    body = msgpack.packb(payload, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def read_reply(sock) -> list:
    header = recv_exactly(sock, HEADER.size)
    return msgpack.unpackb(recv_exactly(sock, HEADER.unpack(header)[0]), raw=False,
                           strict_map_key=False)


def recv_exactly(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


class Exploit:
    """Unpickling this in the server would record it: what a stranger would try."""

    unpickled = []

    def __reduce__(self):
        return Exploit.unpickled.append, ("unpickled",)


@pytest.mark.parametrize("frame", [
    HEADER.pack(40) + pickle.dumps(Exploit()).ljust(40, b"."),   # a pickle, not msgpack
    raw_request([1, "echo", [msgpack.ExtType(1, pickle.dumps(Exploit()))], {}, None]),
    raw_request([1, "echo", [1], {"extra": msgpack.ExtType(1, pickle.dumps(Exploit()))}, None]),
    raw_request([1, "echo", [1], {}, ["acme", "q", "put", 1.0, "n", msgpack.ExtType(1, b"")]]),
    HEADER.pack(MAX_FRAME_BYTES + 1),                             # larger than any frame
], ids=["pickle", "ext-in-args", "ext-in-kwargs", "ext-in-auth", "oversized"])
def test_a_strangers_frame_is_dropped_unopened_and_others_are_served(served, channel, frame):
    Exploit.unpickled.clear()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(served[2])
        sock.sendall(frame)
        sock.settimeout(ANSWER_S)
        assert sock.recv(1) == b""  # dropped, no answer
    assert Exploit.unpickled == [] and served[0].ran == []
    assert ask(channel, "echo", "others")[0] == "others"


# -- the server going away ----------------------------------------------------------------------
CHILD = """
import asyncio
from actors.channel import ChannelServer
from tests.unit.test_channel import SERVED, FakeShard

async def main():
    _, path = await ChannelServer(FakeShard(), SERVED, "child").address()
    print(path, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.fixture
def child():
    """A server in its own process, to kill for real: (process, socket path)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, env=env,
                               cwd=ROOT, text=True)
    path = process.stdout.readline().strip()
    assert path, "the child server did not start"
    yield process, path
    process.kill()
    process.wait()
    process.stdout.close()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)  # a killed server cannot


def test_a_killed_server_fails_every_pending_call_with_channel_lost(child):
    process, path = child
    channel = Channel(path)
    assert ask(channel, "echo", 1)[0] == 1
    pending = [channel.request("park", (f"poll {i}",), {}) for i in range(5)]
    process.kill()
    process.wait()
    for future in pending:
        with pytest.raises(ChannelLost):
            future.result(ANSWER_S)
    assert channel.closed
    with pytest.raises(ChannelLost):
        channel.request("echo", (2,), {})


def test_a_closed_channel_refuses_requests_with_channel_lost(channel):
    channel.close()
    with pytest.raises(ChannelLost):
        channel.request("echo", (1,), {})


def test_closing_the_server_fails_the_pending_calls_with_channel_lost(loop, served, channel):
    target, server, _ = served
    pending = channel.request("park", ("poll",), {})
    wait_until(lambda: "poll" in target.parked, "the call to park")
    on_loop(loop, _close(server))
    with pytest.raises(ChannelLost):
        pending.result(ANSWER_S)


def test_channel_lost_is_a_runtime_failure_callers_retry():
    assert issubclass(ChannelLost, RuntimeFailure)


# -- links -----------------------------------------------------------------------------------
class FakeHandle:
    """Stands where a shard's Ray actor handle stands: ``channel.remote()`` answers with
    ``address``; any other call records that Ray carried it."""

    def __init__(self, address):
        self.address, self.asked, self.ray_calls = address, 0, []
        self.asked_as: list[tuple] = []  # the arguments of each ``channel`` call

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return FakeMethod(self, name)


class FakeMethod:
    def __init__(self, handle, name):
        self.handle, self.name = handle, name

    def remote(self, *args, **kwargs):
        if self.name == "channel":
            self.handle.asked += 1
            self.handle.asked_as.append(args)
            return FakeRef(self.handle.address)
        self.handle.ray_calls.append((self.name, args, kwargs))
        return ("through ray", self.name, args)


class FakeRef:
    def __init__(self, value):
        self.value = value

    def future(self):
        future = concurrent.futures.Future()
        future.set_result(self.value)
        return future


def test_a_link_sends_hot_calls_over_the_channel_of_a_shard_on_this_host(served):
    handle = FakeHandle((host_id(), served[2]))
    link = ShardLink(handle)
    assert link.put.remote(3, b"abc").result(ANSWER_S) == ["3:3"]
    assert link.put.remote(4, b"").result(ANSWER_S) == ["4:0"]
    assert handle.ray_calls == [] and handle.asked == 1
    assert served[2] in _channels
    assert link.stats.remote() == ("through ray", "stats", ())  # not a hot call


def test_a_link_with_the_channel_off_sends_everything_through_ray(served):
    handle = FakeHandle((host_id(), served[2]))
    link = ShardLink(handle, use_channel=False)
    assert link.put.remote(3, b"abc") == ("through ray", "put", (3, b"abc"))
    assert handle.asked == 0 and served[2] not in _channels


def test_a_link_to_a_shard_on_another_host_sends_everything_through_ray(served):
    handle = FakeHandle(("another-host/boot", served[2]))
    link = ShardLink(handle)
    for subqueue in range(3):
        assert link.put.remote(subqueue, b"x") == ("through ray", "put", (subqueue, b"x"))
    assert handle.asked == 1 and served[2] not in _channels


def test_a_link_that_cannot_connect_uses_ray_for_a_while(tmp_path):
    handle = FakeHandle((host_id(), str(tmp_path / "no-socket")))
    link = ShardLink(handle)
    assert link.put.remote(1, b"x") == ("through ray", "put", (1, b"x"))
    assert link.put.remote(1, b"y") == ("through ray", "put", (1, b"y"))
    assert handle.asked == 1  # not asked again within RETRY_CONNECT_S
    assert RETRY_CONNECT_S > 0


def test_a_link_follows_its_shard_to_a_new_socket(loop, serve):
    _, first, first_path = serve()
    handle = FakeHandle((host_id(), first_path))
    link = ShardLink(handle)
    assert link.put.remote(1, b"x").result(ANSWER_S) == ["1:1"]
    _, _, second_path = serve()  # the restarted shard listens elsewhere
    handle.address = (host_id(), second_path)
    on_loop(loop, _close(first))
    wait_until(lambda: _channels[first_path].closed, "the first channel to close")
    assert link.put.remote(2, b"yy").result(ANSWER_S) == ["2:2"]
    assert handle.asked == 2 and not _channels[second_path].closed
    assert handle.ray_calls == []


def test_a_link_inside_an_event_loop_never_waits_for_the_address(served):
    handle = FakeHandle((host_id(), served[2]))
    link = ShardLink(handle)

    async def two_calls():
        return link.put.remote(1, b"x"), link.put.remote(2, b"x")

    first, second = asyncio.run(two_calls())
    assert first == ("through ray", "put", (1, b"x"))  # the address was still being asked
    assert second.result(ANSWER_S) == ["2:1"]


def test_a_link_pickles_as_a_link_that_asks_again(served):
    link = ShardLink(FakeHandle((host_id(), served[2])))
    assert link.put.remote(1, b"x").result(ANSWER_S) == ["1:1"]
    copy = pickle.loads(pickle.dumps(link))
    assert copy.handle.address == link.handle.address and copy.handle.asked == 1
    assert copy.put.remote(5, b"").result(ANSWER_S) == ["5:0"]
    assert copy.handle.asked == 2


def test_encode_request_of_the_client_matches_what_the_server_reads(served):
    # the one frame encoder both the Channel and this test's raw frames agree with
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(served[2])
        sock.sendall(encode_request(11, "echo", ("raw",), {}, None))
        assert read_reply(sock) == [11, 0, ["raw", None, None]]


def test_an_answer_that_does_not_decode_fails_the_pending_calls_with_channel_lost(
        tmp_path, monkeypatch):
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        channel = Channel(path)
        peer, _ = listener.accept()
        with peer:
            pending = channel.request("echo", (1,), {})
            peer.sendall(HEADER.pack(1) + b"\xc1")  # never msgpack
            with pytest.raises(ChannelLost):
                pending.result(ANSWER_S)
    assert channel.closed and died == []  # the reader ended the channel, not by a crash


def test_a_forked_child_opens_a_channel_of_its_own(served):
    from rayq import channel as module
    parent = module._connect(served[2])
    assert ask(parent, "echo", "parent")[0] == "parent"
    link = ShardLink(FakeHandle((host_id(), served[2])))
    assert link._channel() is parent  # the link keeps the channel it used
    pid = os.fork()
    if pid == 0:  # the child: any failure is its exit status
        code = 1
        try:
            mine = module._connect(served[2])
            if (mine is not parent and ask(mine, "echo", "child")[0] == "child"
                    and link._channel() is mine):  # the link let the parent's go
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child did not get its own answer"
    assert not parent.closed and ask(parent, "echo", "parent again")[0] == "parent again"


def test_a_request_too_large_for_a_frame_goes_through_ray_and_spares_the_channel(
        loop, served, monkeypatch):
    target, _, path = served
    monkeypatch.setattr(frames, "MAX_FRAME_BYTES", 4096)
    monkeypatch.setattr("actors.channel.MAX_FRAME_BYTES", 4096)  # the shard's limit too
    handle = FakeHandle((host_id(), path))
    link = ShardLink(handle)
    assert link.put.remote(1, b"small", auth=SIGNED).result(ANSWER_S) == ["1:5"]
    parked = _channels[path].request("park", ("poll",), {})  # another caller's call
    wait_until(lambda: "poll" in target.parked, "the call to park")

    assert link.put.remote(2, b"x" * 8192, auth=SIGNED) == ("through ray", "put", (2, b"x" * 8192))
    assert handle.ray_calls == [("put", (2, b"x" * 8192), {"auth": SIGNED})]  # signed still
    assert link.put.remote(3, b"small").result(ANSWER_S) == ["3:5"]
    loop.call_soon_threadsafe(target.release, "poll")
    assert parked.result(ANSWER_S) == "poll"  # the channel stayed up for everyone on it


def test_a_restarted_server_binds_in_the_same_folder_and_leaves_nothing_behind(tmp_path):
    """A shard's socket folder is named by its data directory: a restart (a new server
    for the same shard, the old one killed without closing) reuses it."""
    async def start():
        server = ChannelServer(FakeShard(), SERVED, "restart", str(tmp_path))
        _, path = await server.address()
        return server, path

    async def both():
        first, path = await start()  # never closed: as a killed shard leaves it
        second, again = await start()
        assert again == path and os.path.exists(path)
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        second.close()
        first.close()
        return path

    path = asyncio.run(both())
    assert not os.path.exists(os.path.dirname(path))


class _Handle:
    """A stand-in for an actor handle: an id, and a method whose remote call says who ran."""

    def __init__(self, actor_id: str):
        self._actor_id = actor_id

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        handle = self

        class _M:
            def remote(self, *args, **kwargs):
                return (handle._actor_id, name)
        return _M()


def test_a_link_finds_its_shards_new_leader_once_a_call_met_a_lost_actor():
    from rayq.channel import actor_lost

    current = {"handle": _Handle("old")}
    link = ShardLink(current["handle"], use_channel=False, resolve=lambda: current["handle"])
    assert link.request("put", (1, b""), {}) == ("old", "put")
    current["handle"] = _Handle("new")           # failover: a new actor under the name
    assert link.stats.remote() == ("old", "stats")  # nothing lost yet: the old handle
    actor_lost()
    assert link.request("put", (1, b""), {}) == ("new", "put")
    assert link.stats.remote() == ("new", "stats")
    revived = pickle.loads(pickle.dumps(ShardLink(_Handle("x"), False, None)))
    assert revived.handle._actor_id == "x"


def test_a_transport_vouches_for_its_calls_to_a_shard_in_this_process_and_signs_the_others(
        loop, serve):
    """A shard's own endpoint calls it in-process (serve_here): such a call carries a
    Vouched, made without any HMAC; a call over the socket still carries a Signature."""
    import base64

    from rayq.config import Config
    from rayq.core.auth.accounts import SECRET_BYTES, Signer
    from rayq.core.auth.gate import Vouched
    from rayq.core.auth.operations import SHARD_OPS
    from rayq.transport import Transport

    key = base64.urlsafe_b64encode(b"k" * SECRET_BYTES).decode()
    (here, here_server, here_path), (there, _, there_path) = serve(), serve()
    on_loop(loop, here_server.serve_here())
    links = [ShardLink(FakeHandle((host_id(), here_path))),
             ShardLink(FakeHandle((host_id(), there_path)))]
    assert [link.in_process() for link in links] == [True, False]
    class CountingSigner(Signer):
        signed = 0

        def sign(self, *args, **kwargs):
            self.signed += 1
            return super().sign(*args, **kwargs)

    signer = CountingSigner("acme", key)
    transport = Transport(None, links, Config(), signer)
    assert transport.request(SHARD_OPS["put"], links[0], 3, b"abc",
                             queue="orders").result(ANSWER_S) == ["3:3"]
    assert signer.signed == 0 and here.auths == [Vouched("acme", "orders")]
    assert transport.request(SHARD_OPS["put"], links[1], 3, b"abc",
                             queue="orders").result(ANSWER_S) == ["3:3"]
    assert signer.signed == 1
    (signed,) = there.auths
    assert isinstance(signed, Signature) and (signed.account, signed.queue) == ("acme", "orders")


def test_a_call_made_on_the_shards_loop_is_a_task_of_it_and_one_from_a_thread_a_future(loop):
    from rayq.channel import run_on

    async def answer():
        return 42

    async def on_the_loop():
        made = run_on(loop, answer())
        return type(made) is asyncio.Task, await made
    assert on_loop(loop, on_the_loop()) == (True, 42)
    made = run_on(loop, answer())
    assert isinstance(made, concurrent.futures.Future) and made.result(ANSWER_S) == 42


class GoneHandle:
    """A handle of an actor Ray no longer knows: every submission fails, as Ray's does."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def remote(self, *args, **kwargs):
        raise Exception("Failed to submit task to actor ActorID(c18f) due to b\"Can't find "
                        "actor c18f. It might be dead or it's from a different cluster\"")


def test_a_call_to_a_leader_replaced_under_its_name_is_issued_again_to_the_new_one():
    fresh = FakeHandle(("another-host/boot", "/nowhere"))
    for use_channel in (True, False):  # asking for its socket, or the call itself
        link = ShardLink(GoneHandle(), use_channel=use_channel, resolve=lambda: fresh)
        with pytest.raises(BetweenPlaces, match="Can't find actor"):  # a restart, for call()
            link.put.remote(1, b"x")
        assert link.put.remote(1, b"x")[0] == "through ray"  # looked up anew: the new leader
    link = ShardLink(GoneHandle(), resolve=lambda: fresh)  # a call that is not a hot one
    with pytest.raises(BetweenPlaces):
        link.stats.remote()
    assert link.stats.remote() == ("through ray", "stats", ())
    with pytest.raises(ValueError):  # any other failure to submit is the caller's
        ShardLink(FakeHandle(None), use_channel=False, resolve=lambda: fresh)._submitted(
            lambda handle: int("x"))


def test_a_shard_list_pickles_with_its_links_to_be_sent_to_another_actor():
    from rayq.remote import ShardLinks

    links = ShardLinks(0, False, ["link-0", "link-1"])
    copy = pickle.loads(pickle.dumps(links))
    assert list(copy) == ["link-0", "link-1"] and copy[1] == "link-1"


# -- over TCP, for clients on other hosts ---------------------------------------------------
ELSEWHERE = "another-host/boot"


@pytest.fixture
def tcp_served(loop):
    """(target, server, ("tcp", address, port, key)): a server that also listens on TCP
    at 127.0.0.1, asked where by a caller on another host."""
    target = FakeShard()
    server = ChannelServer(target, SERVED, "tcp", tcp_host=lambda: "127.0.0.1")
    host, address = on_loop(loop, server.address(ELSEWHERE))
    assert host == host_id() and address[:2] == ("tcp", "127.0.0.1")
    yield target, server, address
    on_loop(loop, _close(server))


def keyed_socket(address, key=None) -> tuple[socket.socket, bytes]:
    """A raw TCP connection to the server, its nonce read and (``key`` given) its hello
    sent with that key."""
    sock = socket.create_connection(address[1:3], timeout=ANSWER_S)
    nonce = recv_exactly(sock, keyed.NONCE_BYTES)
    if key is not None:
        sock.sendall(keyed.hello(key, nonce))
    return sock, nonce


def test_a_caller_on_another_host_is_served_over_tcp_every_frame_keyed(tcp_served):
    target, _, address = tcp_served
    channel = Channel(address)
    try:
        assert ask(channel, "echo", b"far", extra=[1]) == [b"far", [1], None]
        with pytest.raises(ReceiptInvalid):
            ask(channel, "refuse", ["r1"])
        asked = [channel.request("echo", (i,), {}) for i in range(50)]
        assert [f.result(ANSWER_S)[0] for f in asked] == list(range(50))
    finally:
        channel.close()
    sock, nonce = keyed_socket(address, address[3])
    with sock:  # on the wire: the frame, then its MAC; the answer, then its own
        frame = encode_request(7, "echo", ("wire",), {}, None)
        sock.sendall(frame + keyed.frame_mac(address[3], nonce, 0, keyed.REQUEST, frame))
        header = recv_exactly(sock, HEADER.size)
        body = recv_exactly(sock, HEADER.unpack(header)[0])
        assert keyed.checks(recv_exactly(sock, keyed.MAC_BYTES), address[3], nonce, 0,
                            keyed.ANSWER, header, body)
    assert target.ran.count("echo") == 52


def test_a_peer_without_the_key_is_dropped_before_its_frame_is_read(tcp_served):
    target, _, address = tcp_served
    sock, _ = keyed_socket(address, keyed.new_key())
    with sock:
        sock.sendall(encode_request(1, "echo", ("stranger",), {}, None))
        assert sock.recv(1) == b""  # dropped, no answer
    sock, _ = keyed_socket(address)  # no hello: a huge frame announced instead
    with sock:
        sock.sendall(HEADER.pack(MAX_FRAME_BYTES) + b"\x00" * 16)
        assert sock.recv(1) == b""
    assert target.ran == []


@pytest.mark.parametrize("forge", ["replayed", "another-connection", "answer-direction",
                                   "unsigned"])
def test_a_forged_or_replayed_frame_is_refused_and_not_run(tcp_served, forge):
    target, _, address = tcp_served
    key = address[3]
    first = encode_request(1, "echo", ("once",), {}, None)
    sock, nonce = keyed_socket(address, key)
    with sock:
        sock.sendall(first + keyed.frame_mac(key, nonce, 0, keyed.REQUEST, first))
        recv_exactly(sock, HEADER.size)
        forged = encode_request(2, "echo", ("forged",), {}, None)
        mac = {"replayed": keyed.frame_mac(key, nonce, 0, keyed.REQUEST, forged),
               "another-connection": keyed.frame_mac(key, b"\x00" * 16, 1, keyed.REQUEST, forged),
               "answer-direction": keyed.frame_mac(key, nonce, 1, keyed.ANSWER, forged),
               "unsigned": b"\x00" * keyed.MAC_BYTES}[forge]
        sock.sendall(forged + mac)
        while sock.recv(1 << 16):  # the first answer, then the end: nothing for the forgery
            pass
    assert [r for r in target.ran] == ["echo"]


def test_an_answer_whose_mac_does_not_check_fails_the_pending_calls(tmp_path):
    key = keyed.new_key()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = ("tcp", "127.0.0.1", listener.getsockname()[1], key)
        opened = concurrent.futures.ThreadPoolExecutor(1).submit(Channel, address)
        peer, _ = listener.accept()
        with peer:
            nonce = b"n" * keyed.NONCE_BYTES
            peer.sendall(nonce)
            assert keyed.checks(recv_exactly(peer, keyed.MAC_BYTES), key, nonce, 0, keyed.HELLO)
            channel = opened.result(ANSWER_S)
            pending = channel.request("echo", (1,), {})
            answer = frames.encode_reply(0, [1, None, None])
            peer.sendall(answer + keyed.frame_mac(key, nonce, 1, keyed.ANSWER, answer))  # no. 1
            with pytest.raises(ChannelLost):
                pending.result(ANSWER_S)
    assert channel.closed


def test_a_link_to_a_shard_on_another_host_sends_hot_calls_over_tcp(tcp_served, monkeypatch):
    from rayq import channel as module

    shard_host = host_id()
    monkeypatch.setattr(module, "host_id", lambda: ELSEWHERE)  # this link's host: another
    handle = FakeHandle((shard_host, tcp_served[2]))
    link = ShardLink(handle)
    assert link.put.remote(2, b"ab") == ("through ray", "put", (2, b"ab"))  # connecting aside
    wait_until(lambda: link._open is not None, "the TCP channel to open")
    assert link.put.remote(3, b"abc").result(ANSWER_S) == ["3:3"]
    assert link.put.remote(4, b"").result(ANSWER_S) == ["4:0"]
    assert len(handle.ray_calls) == 1 and handle.asked_as == [(ELSEWHERE,)]
    assert tcp_served[2] in _channels
    assert link.stats.remote() == ("through ray", "stats", ())  # not a hot call
    # a shard whose channel takes no one from another host (remote_channel off): Ray
    off = ChannelServer(FakeShard(), SERVED, "no-tcp")
    assert asyncio.run(off.address(ELSEWHERE)) == (shard_host, None)
    handle = FakeHandle((shard_host, None))
    assert ShardLink(handle).put.remote(1, b"x") == ("through ray", "put", (1, b"x"))
    # and a TCP address is never used on the shard's own host, nor a path on another
    monkeypatch.setattr(module, "host_id", lambda: shard_host)
    handle = FakeHandle((shard_host, tcp_served[2]))
    assert ShardLink(handle).put.remote(1, b"y") == ("through ray", "put", (1, b"y"))


def test_a_link_that_cannot_reach_a_shards_port_uses_ray_and_is_never_held_up(monkeypatch):
    from rayq import channel as module

    monkeypatch.setattr(module, "host_id", lambda: ELSEWHERE)
    monkeypatch.setattr(module, "CONNECT_TIMEOUT_S", 0.2)
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, never answers
        address = ("tcp", "127.0.0.1", listener.getsockname()[1], keyed.new_key())
        link = ShardLink(FakeHandle(("shard-host/boot", address)))
        for n in range(3):
            assert link.put.remote(n, b"x") == ("through ray", "put", (n, b"x"))
        wait_until(lambda: not link._connecting, "the connect to give up")
        assert link._open is None and link.put.remote(9, b"x")[0] == "through ray"


def test_a_link_inside_an_event_loop_opens_its_tcp_channel_aside(tcp_served, monkeypatch):
    from rayq import channel as module

    shard_host = host_id()
    monkeypatch.setattr(module, "host_id", lambda: ELSEWHERE)
    link = ShardLink(FakeHandle((shard_host, tcp_served[2])))

    async def calls():
        first = link.put.remote(1, b"x")  # the address comes in the background
        second = link.put.remote(2, b"x")  # the connect goes on aside
        while link._connecting or link._open is None:
            await asyncio.sleep(0.001)
        return first, second, link.put.remote(3, b"xy")

    first, second, third = asyncio.run(asyncio.wait_for(calls(), ANSWER_S))
    assert first == ("through ray", "put", (1, b"x"))
    assert second == ("through ray", "put", (2, b"x"))
    assert third.result(ANSWER_S) == ["3:2"]


# -- inside Ray's TLS, when it is on -------------------------------------------------------
@pytest.fixture
def tls_served(loop, monkeypatch, tmp_path):
    """tcp_served, with Ray's TLS on in this process (the server's and the client's)."""
    ray_tls_on(monkeypatch, tmp_path)
    target = FakeShard()
    server = ChannelServer(target, SERVED, "tls", tcp_host=lambda: "127.0.0.1")
    _, address = on_loop(loop, server.address(ELSEWHERE))
    yield target, server, address
    on_loop(loop, _close(server))


def test_with_rays_tls_on_the_tcp_channel_is_tls_and_a_plain_peer_gets_nothing(tls_served):
    target, _, address = tls_served
    channel = Channel(address)
    try:
        assert ask(channel, "echo", b"sealed") == [b"sealed", None, None]
        asked = [channel.request("echo", (b"x" * 200_000, i), {}) for i in range(20)]
        assert [f.result(ANSWER_S)[1] for f in asked] == list(range(20))
    finally:
        channel.close()
    with socket.create_connection(address[1:3], timeout=ANSWER_S) as sock:
        sock.sendall(b"\x00" * 64)  # not a TLS hello: no nonce, nothing read, dropped
        assert sock.recv(1 << 16) == b""
    assert target.ran.count("echo") == 21


def test_a_peer_with_another_cas_certificate_is_refused(tls_served, monkeypatch, tmp_path):
    target, _, address = tls_served
    (tmp_path / "other").mkdir()
    ray_tls_on(monkeypatch, tmp_path / "other")  # a client whose certificates differ
    with pytest.raises(OSError):
        Channel(address)
    assert target.ran == []


def test_a_tcp_channel_being_opened_holds_up_no_other_link(served, monkeypatch):
    from rayq import channel as module

    monkeypatch.setattr(module, "CONNECT_TIMEOUT_S", 60.0)
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, never answers
        address = ("tcp", "127.0.0.1", listener.getsockname()[1], keyed.new_key())
        monkeypatch.setattr(module, "host_id", lambda: ELSEWHERE)
        far = ShardLink(FakeHandle(("shard-host/boot", address)))
        assert far.put.remote(1, b"x")[0] == "through ray"
        wait_until(lambda: far._connecting, "the TCP connect to start")
        monkeypatch.setattr(module, "host_id", host_id)
        near = ShardLink(FakeHandle((host_id(), served[2])))
        assert near.put.remote(2, b"yz").result(ANSWER_S) == ["2:2"]  # not behind it
        assert far._connecting  # still opening
        accepted, _ = listener.accept()
        accepted.close()  # the shard side goes away: the connect fails, Ray goes on
        wait_until(lambda: not far._connecting, "the TCP connect to give up")
    assert far._open is None and far.put.remote(3, b"x")[0] == "through ray"
