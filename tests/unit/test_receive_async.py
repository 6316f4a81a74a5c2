"""Queue.receive and Queue.receive_async share one sequence of requests; the awaited one
parks in the shard with no thread waiting for it (a real Transport over fake actors:
their calls answer concurrent futures, as the local channel does)."""

import asyncio
import threading
from concurrent.futures import Future
from dataclasses import replace

import pytest

from rayq.config import Config
from rayq.core.codec.model import SubqueueState, encode_body
from rayq.core.codec.wire import encode_delivered
from rayq.core.control.registry import QueueInfo, SubqueueInfo
from rayq.errors import QueueDisabled, QueueNotFound
from rayq.queue import Queue
from rayq.sqs.admission import Parked
from rayq.sqs.errors import SqsError
from rayq.transport import Transport

QUEUE = QueueInfo("jobs", (SubqueueInfo(0, 0, SubqueueState.ALL, 1),), 1, None, (), 0.0)


def answered(value) -> Future:
    future = Future()
    (future.set_exception if isinstance(value, BaseException) else future.set_result)(value)
    return future


def delivered(*bodies: str) -> bytes:
    return encode_delivered([[f"m{i}", f"r{i}", encode_body(b, 1 << 20), "acme", "default",
                              "", 1, 0, 0, 1] for i, b in enumerate(bodies)])


class Method:
    def __init__(self, answer):
        self.answer = answer

    def remote(self, *args, **kwargs):
        return self.answer(*args, **kwargs)


class FakeManager:
    def __init__(self):
        self.routings = 0
        self.routing = Method(self._routing)

    def _routing(self, name, auth=None):
        self.routings += 1
        return answered((QUEUE, [0], 0))


class FakeShard:
    """A shard's receive: empty at once without a wait; parked (a pending future the
    test answers) with one; ``refuse`` raises QueueDisabled once."""

    def __init__(self):
        self.parked: list[tuple[float, Future]] = []
        self.refuse = False
        self.receive = Method(self._receive)

    def _receive(self, subqueues, n, visibility_timeout_s, *, wait_s, auth=None, **kwargs):
        if self.refuse:
            self.refuse = False
            return answered(QueueDisabled("subqueue 0 was dropped"))
        if not wait_s:
            return answered(delivered())
        self.parked.append((wait_s, Future()))
        return self.parked[-1][1]


@pytest.fixture
def parts():
    manager, shard = FakeManager(), FakeShard()
    config = replace(Config(), store=replace(Config().store, local_channel=False))
    return manager, shard, Queue(Transport(manager, [shard], config), "jobs")


async def until_parked(shard: FakeShard) -> None:
    while not shard.parked:
        await asyncio.sleep(0)


def test_a_parked_async_receive_holds_no_thread_and_returns_what_the_shard_wakes_it_with(parts):
    _, shard, queue = parts

    async def scenario():
        threads = threading.active_count()
        polling = asyncio.ensure_future(queue.receive_async(wait_s=10))
        await until_parked(shard)
        assert threading.active_count() == threads  # nothing but the loop waits for it
        [(wait_s, future)] = shard.parked
        assert 0 < wait_s <= 10  # the shard parks it, for the poll's own wait
        future.set_result(delivered("woken"))  # as a put wakes the parked receive
        return await polling
    [got] = asyncio.run(scenario())
    assert got.body == "woken" and got.receipt == "r0"


def test_a_receive_meeting_a_dropped_subqueue_routes_anew_both_ways(parts):
    manager, shard, queue = parts
    shard.refuse = True
    assert queue.receive() == [] and manager.routings == 2

    async def scenario():
        shard.refuse = True
        polling = asyncio.ensure_future(queue.receive_async(wait_s=5))
        await until_parked(shard)
        shard.parked[0][1].set_result(delivered("after"))
        return await polling
    assert [m.body for m in asyncio.run(scenario())] == ["after"] and manager.routings == 3


def test_an_async_receive_checks_its_arguments_as_receive_does(parts):
    _, _, queue = parts
    with pytest.raises(Exception) as sync:
        queue.receive(wait_s=21)
    with pytest.raises(Exception) as awaited:
        asyncio.run(queue.receive_async(wait_s=21))
    assert type(sync.value) is type(awaited.value) and str(sync.value) == str(awaited.value)


def test_a_parked_answer_is_awaited_then_finished_and_rayq_errors_become_sqs_errors():
    async def found():
        return ["m"]

    async def gone():
        raise QueueNotFound("jobs")

    def missing(got):
        raise QueueNotFound("jobs")
    parked = Parked(found(), lambda got: {"Messages": got})
    assert parked.finish(asyncio.run(parked.result())) == {"Messages": ["m"]}
    with pytest.raises(SqsError) as info:
        asyncio.run(Parked(gone(), lambda got: {}).result())
    assert info.value.code == "QueueDoesNotExist"
    with pytest.raises(SqsError) as info:
        Parked(None, missing).finish(["m"])  # nothing to await: only the finish is run
    assert info.value.code == "QueueDoesNotExist"
