"""The producer over a fake transport (no Ray): attribute checks, one encode per message,
concurrent senders sharing one put, each getting its own ids, and a retired subqueue
routed around."""

import sys
import threading
import time
from dataclasses import replace

import pytest

from rayq import batching
from rayq.config import Config
from rayq.core.codec.model import MAX_BATCH, SubqueueState, decode_body, fairness_key
from rayq.core.codec.wire import decode_put
from rayq.core.control.registry import QueueInfo, SubqueueInfo
from rayq.core.control.routes import Route
from rayq.errors import InvalidMessage, MessageTooLarge, QueueDisabled
from rayq.sending import OWN_PUT_MESSAGES, PUT_ATTEMPTS, Producer, lane_target
from rayq.steps import drive

ALL, NO_PUT = SubqueueState.ALL, SubqueueState.NO_PUT
WAIT_S = 10.0  # bounds a hang only: every held put here is released


class FakeShard:
    """A shard's put: records each put call's decoded batch and answers an id a message.
    ``hold`` keeps the first put waiting until set, ``holds`` a put of one of its bodies
    until that body's Event is set; ``retired`` subqueues refuse puts."""

    def __init__(self, index: int, transport: "FakeTransport"):
        self.index, self.transport = index, transport
        self.puts: list[tuple[int, list]] = []  # (subqueue, bodies) per call
        self.hold: threading.Event | None = None
        self.holds: dict[str, threading.Event] = {}
        self.delay_s = 0.0

    def put(self, subqueue: int, batch: bytes) -> list[str]:
        hold, self.hold = self.hold, None
        if hold is not None:
            hold.wait(WAIT_S)
        if self.delay_s:
            time.sleep(self.delay_s)  # a put's round trip
        if subqueue in self.transport.retired:
            raise QueueDisabled(f"subqueue {subqueue} takes no puts")
        store = Config().store
        got = decode_put(batch, max_message_bytes=store.max_message_bytes,
                         max_delay_s=store.max_delay_s, max_ttl_s=store.max_ttl_s)
        bodies = [decode_body(b) for b in got.bodies]
        for body in bodies:
            if body in self.holds:
                self.holds[body].wait(WAIT_S)
        self.puts.append((subqueue, bodies))
        return [f"id-{b}" for b in bodies]


class FakeTransport:
    """What a Producer needs of a transport: config, account, shards, route and call.
    Subqueue i lives on shard i; the route's put subqueue is the first not retired."""

    def __init__(self, shards: int = 2, account: str = "acme"):
        self.config = Config()
        self.account = account
        self.shards = [FakeShard(i, self) for i in range(shards)]
        self.retired: set[int] = set()
        self.routes = self.refreshes = 0
        self.calls: list[tuple[str, str]] = []

    def route(self, name: str, refresh: bool = False) -> Route:
        self.routes += 1
        self.refreshes += refresh
        subqueues = tuple(SubqueueInfo(i, i, SubqueueState.ALL, 1) for i in range(len(self.shards)))
        info = QueueInfo(name, subqueues, 1, None, (), 0.0)
        target = next((i for i in range(len(self.shards)) if i not in self.retired), 0)
        return Route(info, list(range(len(self.shards))), target)

    def call(self, operation, handle, *args, queue=None, **kwargs):
        self.calls.append((queue, operation.method))
        return getattr(handle, operation.method)(*args, **kwargs)

    def route_steps(self, name: str, refresh: bool = False):
        return self.route(name, refresh)
        yield  # a generator that needs no request: the route is at hand

    def run(self, steps):
        return drive(steps, lambda r: self.call(r.operation, r.handle, *r.args, **r.kwargs))

    async def run_async(self, steps):
        return self.run(steps)

    def flushes(self) -> list[list]:
        return [bodies for shard in self.shards for _, bodies in shard.puts]


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)


# -- a message's shape ------------------------------------------------------------------
def test_a_message_is_checked_and_encoded_once_with_the_account_as_its_default_tenant():
    producer = Producer(FakeTransport(account="acme"), "jobs")
    attrs, body = producer.message({"n": 1}, type="email", delay_s=2, ttl_s=60)
    assert (attrs.tenant, attrs.type, attrs.delay_us, attrs.ttl_us, attrs.task) == (
        "acme", "email", 2_000_000, 60_000_000, False)
    assert attrs.key == fairness_key("acme", "email", Config().fairness.key)
    assert isinstance(body, bytes) and decode_body(body) == {"n": 1}


@pytest.mark.parametrize("attrs, error", [
    ({"tenant": "bell\a"}, InvalidMessage),
    ({"tenant": 7}, InvalidMessage),
    ({"type": ""}, InvalidMessage),
    ({"delay_s": -1}, InvalidMessage),
    ({"delay_s": Config().store.max_delay_s + 1}, InvalidMessage),
    ({"ttl_s": 0}, InvalidMessage),
    ({"ttl_s": "soon"}, InvalidMessage),
])
def test_bad_attributes_raise_before_anything_is_sent(attrs, error):
    transport = FakeTransport()
    with pytest.raises(error):
        Producer(transport, "jobs").message("body", **attrs)
    assert transport.calls == []


def test_a_body_past_the_size_limit_raises_message_too_large():
    transport = FakeTransport()
    with pytest.raises(MessageTooLarge):
        Producer(transport, "jobs").message(b"x" * (Config().store.max_message_bytes + 1))


def test_task_attributes_are_marked_as_tasks():
    assert Producer(FakeTransport(), "tasks").attrs("t1", "resize", 0, None, task=True).task


# -- putting ---------------------------------------------------------------------------
def test_a_batch_is_one_put_call_and_its_ids_come_back_in_order_with_the_shard():
    transport = FakeTransport()
    producer = Producer(transport, "jobs")
    placed = producer.put([producer.message(n) for n in range(MAX_BATCH)])
    assert placed == [(f"id-{n}", 0) for n in range(MAX_BATCH)]
    assert transport.calls == [("jobs", "put")] and transport.flushes() == [list(range(MAX_BATCH))]


def test_a_retired_subqueue_is_routed_around_and_the_put_lands_on_the_next():
    transport = FakeTransport()
    producer = Producer(transport, "jobs")
    real_route = transport.route

    def stale_then_fresh(name, refresh=False):  # the kept route names subqueue 0, retired
        route = real_route(name, refresh)
        return route if refresh else route._replace(target=0)

    transport.route = stale_then_fresh
    transport.retired.add(0)
    assert producer.put([producer.message("m")]) == [("id-m", 1)]
    assert transport.refreshes == 1 and transport.shards[1].puts == [(1, ["m"])]


def test_a_queue_whose_every_route_is_retired_raises_queue_disabled_after_a_few_tries():
    transport = FakeTransport(shards=1)
    transport.retired.add(0)
    producer = Producer(transport, "jobs")
    with pytest.raises(QueueDisabled, match="jobs"):
        producer.put([producer.message("m")])
    assert len(transport.calls) == PUT_ATTEMPTS and producer.in_flight == 0


@pytest.mark.parametrize("kept, fresh, shard_refuses, puts", [
    (False, True, True, 0),   # disabled since the route was kept: the shard refuses the put
    (True, False, False, 1),  # enabled since: the fresh route takes the put
    (True, True, False, 0),   # disabled throughout: refused without a put
])
def test_a_disabled_queue_refuses_sends_once_a_fresh_route_says_so(kept, fresh, shard_refuses,
                                                                   puts):
    transport = FakeTransport(shards=1)
    real_route = transport.route

    def route(name, refresh=False):  # the kept and the fresh route say disabled or not
        got = real_route(name, refresh)
        return got._replace(queue=replace(got.queue, disabled=fresh if refresh else kept))

    transport.route = route
    if shard_refuses:
        transport.retired.add(0)
    producer = Producer(transport, "jobs")
    if fresh:
        with pytest.raises(QueueDisabled, match="disabled"):
            producer.put([producer.message("m")])
    else:
        assert producer.put([producer.message("m")]) == [("id-m", 0)]
    assert len(transport.shards[0].puts) == puts and transport.refreshes == 1


def test_senders_waiting_behind_a_put_share_the_next_one_and_get_their_own_ids():
    transport = FakeTransport()
    transport.shards[0].hold = release = threading.Event()
    producer = Producer(transport, "jobs")
    results = {}

    def send(n):
        results[n] = producer.put([producer.message(n), producer.message(n + 100)])

    leader = threading.Thread(target=send, args=(0,))
    leader.start()
    wait_until(lambda: transport.calls)  # the first put is under way, held
    followers = [threading.Thread(target=send, args=(n,)) for n in (1, 2, 3)]
    for t in followers:
        t.start()
    wait_until(lambda: len(producer) == 3)
    release.set()
    for t in [leader, *followers]:
        t.join(WAIT_S)
    assert results == {n: [(f"id-{n}", 0), (f"id-{n + 100}", 0)] for n in range(4)}
    flushes = transport.flushes()
    assert len(flushes) == 2 and sorted(flushes[1]) == [1, 2, 3, 101, 102, 103]


def test_with_two_puts_in_flight_a_sender_is_not_held_behind_a_slow_put():
    transport = FakeTransport()
    transport.shards[0].hold = release = threading.Event()
    producer = Producer(transport, "jobs", max_in_flight=2)
    first = threading.Thread(target=producer.put, args=([producer.message(0)],))
    first.start()
    wait_until(lambda: transport.shards[0].hold is None)  # the first put is held
    assert producer.put([producer.message(1)]) == [("id-1", 0)]
    release.set()
    first.join(WAIT_S)
    assert transport.flushes() == [[1], [0]]


def test_a_failed_put_reaches_every_sender_of_it():
    transport = FakeTransport()

    def broken(subqueue, batch):
        raise RuntimeError("shard gone")

    transport.shards[0].put = broken
    producer = Producer(transport, "jobs")
    with pytest.raises(RuntimeError, match="shard gone"):
        producer.put([producer.message("m")])
    assert producer.in_flight == 0


def test_senders_answered_in_a_loop_join_the_next_put_whole():
    """Eight threads sending in a loop: each put after the first carries (nearly) all of
    them, not the one that arrived during the previous put and then the rest."""
    transport = FakeTransport()
    transport.shards[0].delay_s = 0.01  # time for every sender to queue, on a busy machine too
    producer = Producer(transport, "jobs")

    def loop(n):
        for i in range(20):
            assert producer.put([producer.message(f"{n}.{i}")]) == [(f"id-{n}.{i}", 0)]

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sizes = [len(f) for f in transport.flushes()]
    assert sum(sizes) == 160
    assert sorted(sizes)[len(sizes) // 2] >= 6  # median put: most of the eight senders


@pytest.fixture
def threads_switch_often():
    """Threads change hands about every microsecond, as a loaded machine now and then makes
    them: a race between two bytecodes then shows in most runs, not in one of hundreds."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_many_leaders_never_lose_the_lead(threads_switch_often):
    """With several puts in flight, a sender handed the lead after another leader took
    its messages still leads (or gives the lead back): nobody waits forever."""
    transport = FakeTransport()
    producer = Producer(transport, "jobs", max_in_flight=3)
    done = []

    def loop(n):
        for i in range(50):
            producer.put([producer.message(f"{n}.{i}")])
        done.append(n)

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(done) == list(range(12))
    assert producer.in_flight == 0 and sum(len(f) for f in transport.flushes()) == 600


def test_two_leaders_handing_the_lead_to_one_sender_not_yet_awake_leave_it_one_lead(
        monkeypatch):
    """Two puts in flight end while the sender waiting behind them has not run yet: both
    leaders pass the lead to it, the oldest pending. It can run one lead, so the second
    leader gives its lead back, and no put is counted in flight once all have returned."""
    asleep, awake = threading.Event(), threading.Event()

    class Drowsy(threading.Event):
        """A waiting sender's wake-up that returns only once ``awake`` is set: a thread the
        scheduler has not run yet, made to stay so."""

        def wait(self, timeout=None):
            asleep.set()
            awake.wait(WAIT_S)
            return super().wait(timeout)

    class DrowsySlot(batching._Slot):
        __slots__ = ()

        def __init__(self):
            super().__init__()
            self.wake = Drowsy()

    monkeypatch.setattr(batching, "_Slot", DrowsySlot)
    transport = FakeTransport()
    release = transport.shards[0].holds = {"x": threading.Event(), "y": threading.Event()}
    producer = Producer(transport, "jobs", max_in_flight=2)
    results = {}

    def send(body):
        results[body] = producer.put([producer.message(body)])

    senders = {body: threading.Thread(target=send, args=(body,)) for body in "xyz"}
    senders["x"].start()
    senders["y"].start()
    wait_until(lambda: len(transport.calls) == 2)  # both lead a put, held
    senders["z"].start()
    asleep.wait(WAIT_S)  # z waits behind them (leaders never wait on their wake-up)
    for body in "xy":
        release[body].set()
        senders[body].join(WAIT_S)  # its put ended and it passed the lead to z
    assert producer.in_flight == 1  # z's lead, handed twice, counted once
    awake.set()
    senders["z"].join(WAIT_S)
    assert results == {body: [(f"id-{body}", 0)] for body in "xyz"}
    assert producer.in_flight == 0 and transport.flushes() == [["x"], ["y"], ["z"]]


def test_large_batches_of_two_threads_go_to_two_subqueues_without_waiting_for_each_other():
    transport = FakeTransport(shards=2)
    producer = Producer(transport, "jobs")
    batch = [producer.message(i) for i in range(OWN_PUT_MESSAGES)]
    threads = [threading.Thread(target=producer.put, args=(batch,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert sorted(sq for shard in transport.shards for sq, _ in shard.puts) == [0, 1]
    assert producer.put(batch)[0][1] == 0  # this thread's lane: the routed subqueue


def test_a_small_send_still_coalesces_on_the_routed_subqueue():
    transport = FakeTransport(shards=2)
    producer = Producer(transport, "jobs")
    producer.put([producer.message(i) for i in range(OWN_PUT_MESSAGES - 1)])
    assert [sq for shard in transport.shards for sq, _ in shard.puts] == [0]


def test_a_threads_single_sends_follow_its_large_batch_to_the_same_subqueue():
    transport = FakeTransport(shards=2)
    producer = Producer(transport, "jobs")
    landed = {}

    def sender(name: str, started: threading.Event, go: threading.Event) -> None:
        placed = producer.put([producer.message(f"{name}{i}") for i in range(OWN_PUT_MESSAGES)])
        started.set()
        go.wait(WAIT_S)
        for i in range(5):
            placed += producer.put([producer.message(f"{name}-single{i}")])
        landed[name] = {shard for _, shard in placed}

    first_in, second_in, go = threading.Event(), threading.Event(), threading.Event()
    first = threading.Thread(target=sender, args=("a", first_in, go))
    first.start()
    first_in.wait(WAIT_S)  # lanes go in order: "a" takes lane 0, "b" lane 1
    second = threading.Thread(target=sender, args=("b", second_in, go))
    second.start()
    second_in.wait(WAIT_S)
    go.set()
    for t in (first, second):
        t.join(WAIT_S)
    assert landed == {"a": {0}, "b": {1}}
    assert producer.put([producer.message("main thread")])[0][1] == 0  # no lane: routed


@pytest.mark.parametrize("states, target, lane, expected", [
    ([ALL, ALL, ALL], 1, 0, 1),       # lane 0: the routed subqueue
    ([ALL, ALL, ALL], 1, 1, 2),       # the next open one
    ([ALL, ALL, ALL], 2, 1, 0),       # round the queue
    ([ALL, NO_PUT, ALL], 0, 1, 2),    # retired subqueues are skipped
    ([ALL, ALL], 0, 4, 0),            # lanes wrap
])
def test_a_lane_puts_that_many_open_subqueues_after_the_routed_one(states, target, lane,
                                                                    expected):
    subqueues = tuple(SubqueueInfo(i, i, state, 1) for i, state in enumerate(states))
    queue = QueueInfo("q", subqueues, 1, None, (), 0.0)
    assert lane_target(queue, target, lane) == expected
