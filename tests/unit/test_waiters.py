"""Calls waiting for task outcomes (rayq.core.storage.waiters), across threads and loops."""

import asyncio
import threading

import pytest

from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import encode_error, encode_result
from rayq.core.storage.waiters import OutcomeWaiters, outcome_value
from rayq.errors import TaskError


class Table:
    """The outcomes table as the store holds it; counts its reads."""

    def __init__(self, ended=None):
        self.ended, self.reads = dict(ended or {}), 0

    async def read(self, ids):
        self.reads += 1
        return [self.ended.get(mid) for mid in ids]


def test_ended_tasks_no_one_told_of_are_answered_from_one_read_of_the_table():
    table = Table({"a": (Ending.RESULT, b"1"), "b": (Ending.DEAD, b"")})
    waiters = OutcomeWaiters(table.read, recheck_s=0.01)
    assert asyncio.run(waiters.wait(["a", "b"])) == [(Ending.RESULT, b"1"), (Ending.DEAD, b"")]
    assert table.reads == 1


def test_an_end_recorded_on_another_thread_wakes_the_waiters_of_that_message():
    table = Table({"a": (Ending.RESULT, b"1")})
    waiters = OutcomeWaiters(table.read, recheck_s=30)
    waiters.notify([("a", Ending.RESULT, b"1")])  # told before the wait: found at the first look

    async def scenario():
        waiting = asyncio.ensure_future(waiters.wait(["a", "b"]))
        while waiters.waiting("b") == 0:      # registered: now end "b"
            await asyncio.sleep(0)
        recorder = threading.Thread(target=waiters.notify,
                                    args=([("b", Ending.RESULT, b"2"), ("z", Ending.DEAD, b"")],))
        recorder.start()
        got = await asyncio.wait_for(waiting, 30)
        recorder.join()
        return got

    assert asyncio.run(scenario()) == [(Ending.RESULT, b"1"), (Ending.RESULT, b"2")]
    assert table.reads == 0                   # woken, never read


def test_a_waiter_that_was_told_nothing_reads_the_table_again():
    table = Table()
    waiters = OutcomeWaiters(table.read, recheck_s=0.01)

    async def scenario():
        waiting = asyncio.ensure_future(waiters.wait(["a"]))
        while table.reads == 0:
            await asyncio.sleep(0)
        table.ended["a"] = (Ending.EXPIRED, b"")   # recorded without a wake-up
        return await asyncio.wait_for(waiting, 30)

    assert asyncio.run(scenario()) == [(Ending.EXPIRED, b"")]
    assert table.reads >= 2


def test_a_ref_resolves_to_the_handlers_value_or_raises_why_it_has_none():
    assert outcome_value(Ending.RESULT, encode_result([1, "a"], "t")) == [1, "a"]
    with pytest.raises(TaskError) as failed:
        outcome_value(Ending.RESULT, encode_error("KeyError", "'x'"))
    assert failed.value.error_type == "KeyError"
    for ending, name in [(Ending.DEAD, "DeadLettered"), (Ending.EXPIRED, "Expired"),
                         (Ending.DELETED, "Deleted")]:
        with pytest.raises(TaskError) as ended:
            outcome_value(ending, b"")
        assert ended.value.error_type == name


def test_an_end_forgotten_in_order_makes_a_later_wait_wait_for_the_next_end():
    table = Table()
    waiters = OutcomeWaiters(table.read, recheck_s=30)
    waiters.notify([("a", Ending.DEAD, b""), ("a", None, b"")])  # dead-lettered, redriven

    async def scenario():
        waiting = asyncio.ensure_future(waiters.wait(["a"]))
        while waiters.waiting("a") == 0:  # the old end is not taken: it waits
            await asyncio.sleep(0)
        waiters.notify([("a", Ending.RESULT, b"2")])  # the run after the redrive
        return await asyncio.wait_for(waiting, 30)

    assert asyncio.run(scenario()) == [(Ending.RESULT, b"2")]
    assert asyncio.run(waiters.wait(["a"])) == [(Ending.RESULT, b"2")]  # kept as the latest
    assert table.reads == 0
