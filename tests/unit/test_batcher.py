"""Group commit's policy (rayq.core.kit.batcher) and its asyncio adapter: who leads a flush,
what the next flush takes, the caps, and how results and errors reach each caller.
The thread adapter is exercised through the send coalescer in test_sending.py."""

import asyncio

import pytest

from rayq.batching import AsyncBatcher
from rayq.core.kit.batcher import Batcher
from rayq.errors import Overloaded, RuntimeFailure
from tests.unit.loop import until


def fill(batcher: Batcher, *items) -> list[bool]:
    """Add each item with a waiter named after it; whether each caller was told to lead."""
    return [batcher.add(item, f"w{item}") for item in items]


# -- the policy ------------------------------------------------------------------------
@pytest.mark.parametrize("max_in_flight, leads", [
    (1, [True, False, False, False]),
    (2, [True, True, False, False]),
    (4, [True, True, True, True]),
])
def test_the_first_callers_lead_up_to_max_in_flight_and_the_rest_wait(max_in_flight, leads):
    assert fill(Batcher(max_in_flight=max_in_flight), 1, 2, 3, 4) == leads


def test_a_flush_takes_everything_pending_oldest_first():
    batcher = Batcher()
    fill(batcher, 1, 2, 3)
    batch = batcher.take()
    assert (batch.items, batch.waiters, len(batcher)) == ([1, 2, 3], ["w1", "w2", "w3"], 0)


def test_calls_made_during_a_flush_wait_for_the_next_one():
    batcher = Batcher()
    fill(batcher, 1)
    first = batcher.take()
    assert fill(batcher, 2, 3) == [False, False]  # the leader is still flushing
    assert first.items == [1] and batcher.take().items == [2, 3]


def test_the_leader_stops_when_nothing_is_pending_and_the_next_caller_leads():
    batcher = Batcher()
    fill(batcher, 1)
    batcher.take()
    assert batcher.take() is None and batcher.in_flight == 0
    assert fill(batcher, 2) == [True]


def test_a_leader_that_leaves_early_lets_the_next_caller_lead():
    batcher = Batcher()
    fill(batcher, 1)
    batcher.take()
    batcher.leave()  # its flush was cancelled
    assert fill(batcher, 2) == [True]


@pytest.mark.parametrize("max_items, pending, flushes", [
    (2, [1, 2, 3, 4, 5], [[1, 2], [3, 4], [5]]),
    (5, [1, 2, 3], [[1, 2, 3]]),
    (1, [1, 2], [[1], [2]]),
])
def test_a_flush_takes_at_most_max_items_calls(max_items, pending, flushes):
    batcher = Batcher(max_items=max_items)
    fill(batcher, *pending)
    assert [b.items for b in iter(batcher.take, None)] == flushes


@pytest.mark.parametrize("sends, flushes", [
    ([[1, 2], [3, 4], [5]], [[1, 2], [3, 4, 5]]),     # whole sends only, up to 3 messages
    ([[1, 2, 3, 4, 5], [6]], [[1, 2, 3, 4, 5], [6]]),  # a send over the cap goes alone
    ([[1], [2, 3, 4, 5], [6]], [[1], [2, 3, 4, 5], [6]]),
    ([[1], [2], [3]], [[1, 2, 3]]),
])
def test_sized_calls_are_taken_whole_up_to_max_items_items(sends, flushes):
    batcher = Batcher(max_items=3, sized=True)
    for n, send in enumerate(sends):
        batcher.add(send, n)
    assert [b.items for b in iter(batcher.take, None)] == flushes


def test_each_sized_call_gets_the_slice_of_results_its_items_got():
    batcher = Batcher(sized=True)
    batcher.add(["a", "b"], "first")
    batcher.add(["c"], "second")
    batch = batcher.take()
    assert batch.items == ["a", "b", "c"]
    assert batch.results(["id-a", "id-b", "id-c"]) == [["id-a", "id-b"], ["id-c"]]


def test_each_call_gets_its_own_result_and_an_error_stays_with_its_call():
    batcher = Batcher()
    fill(batcher, 1, 2)
    refused = KeyError("receipt")
    assert batcher.take().results(["ok", refused]) == ["ok", refused]


def test_a_failed_flush_fails_every_call_of_it_with_its_error():
    batcher = Batcher(sized=True)
    batcher.add([1, 2], "a")
    batcher.add([3], "b")
    err = OSError("disk gone")
    assert batcher.take().failed(err) == [err, err]


def test_a_flush_that_returns_the_wrong_number_of_results_is_a_runtime_failure():
    batcher = Batcher()
    fill(batcher, 1, 2)
    with pytest.raises(RuntimeFailure, match="flush of 2 items returned 1 results"):
        batcher.take().results(["only one"])


def test_calls_over_max_pending_are_overloaded_and_calls_in_flight_do_not_count():
    batcher = Batcher(max_pending=2, name="shard 3")
    fill(batcher, 1, 2)
    with pytest.raises(Overloaded, match="shard 3 has 2 calls waiting"):
        batcher.add(3, "w3")
    batcher.take()  # in flight now: room again
    assert fill(batcher, 3, 4) == [False, False] and len(batcher) == 2


@pytest.mark.parametrize("settings", [dict(max_in_flight=0), dict(max_items=0)])
def test_a_batcher_that_could_never_flush_is_refused(settings):
    with pytest.raises(ValueError):
        Batcher(**settings)


# -- the asyncio adapter ---------------------------------------------------------------
class Store:
    """A flush that records its batches; each one waits for ``gate`` when given one."""

    def __init__(self, gate: asyncio.Event | None = None, fail: BaseException | None = None):
        self.flushes: list[list] = []
        self.gate, self.fail = gate, fail

    async def flush(self, items: list) -> list:
        self.flushes.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [ValueError(i) if i < 0 else i * 10 for i in items]


def test_async_calls_made_during_a_flush_share_the_next_one_and_get_their_own_results():
    async def main():
        store = Store(gate=asyncio.Event())
        batcher = AsyncBatcher(Batcher(), store.flush)
        first = asyncio.ensure_future(batcher.call(1))
        await until(lambda: store.flushes)  # the first flush is under way, held
        rest = [asyncio.ensure_future(batcher.call(i)) for i in (2, 3, 4)]
        await until(lambda: len(batcher) == 3)
        store.gate.set()
        return await asyncio.gather(first, *rest), store.flushes

    results, flushes = asyncio.run(main())
    assert results == [10, 20, 30, 40] and flushes == [[1], [2, 3, 4]]


def test_an_async_callers_error_is_raised_to_it_alone():
    async def main():
        store = Store()
        batcher = AsyncBatcher(Batcher(), store.flush)
        return await asyncio.gather(batcher.call(5), batcher.call(-1), return_exceptions=True)

    ok, refused = asyncio.run(main())
    assert ok == 50 and isinstance(refused, ValueError) and refused.args == (-1,)


def test_submit_hands_an_error_back_as_a_value():
    async def main():
        batcher = AsyncBatcher(Batcher(), Store().flush)
        return await asyncio.gather(batcher.submit(-2), batcher.submit(2))

    refused, ok = asyncio.run(main())
    assert isinstance(refused, ValueError) and ok == 20


def test_a_failed_async_flush_reaches_every_caller_and_the_next_call_flushes_again():
    async def main():
        store = Store(fail=OSError("shard gone"))
        batcher = AsyncBatcher(Batcher(), store.flush)
        failed = await asyncio.gather(batcher.call(1), batcher.call(2), return_exceptions=True)
        store.fail = None
        return failed, await batcher.call(3)

    failed, later = asyncio.run(main())
    assert [str(e) for e in failed] == ["shard gone", "shard gone"] and later == 30


def test_async_calls_over_max_pending_are_refused_at_once():
    async def main():
        store = Store(gate=asyncio.Event())
        batcher = AsyncBatcher(Batcher(max_pending=1), store.flush)
        first = batcher.submit(1)
        await until(lambda: store.flushes)
        second = batcher.submit(2)  # waits for the next flush: the one pending call allowed
        with pytest.raises(Overloaded):
            batcher.submit(3)
        store.gate.set()
        return await asyncio.gather(first, second)

    assert asyncio.run(main()) == [10, 20]


def test_a_cancelled_flush_cancels_its_callers_and_the_next_call_leads_again():
    async def main():
        store = Store(gate=asyncio.Event())
        batcher = AsyncBatcher(Batcher(), store.flush)
        stuck = batcher.submit(1)
        await until(lambda: store.flushes)
        leader = next(t for t in asyncio.all_tasks() if t is not asyncio.current_task())
        leader.cancel()
        await until(stuck.done)
        store.gate.set()
        return stuck.cancelled(), await batcher.call(2)

    assert asyncio.run(main()) == (True, 20)
