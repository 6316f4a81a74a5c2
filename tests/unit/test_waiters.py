"""Calls waiting for task outcomes (rayq.core.waiters), across threads and loops."""

import asyncio
import threading

import pytest

from rayq.core.model import Ending
from rayq.core.tasks import encode_error, encode_result
from rayq.core.waiters import OutcomeWaiters, outcome_value
from rayq.errors import TaskError


def test_an_outcome_recorded_on_another_thread_wakes_every_waiter_of_that_message():
    waiters = OutcomeWaiters()

    async def scenario():
        first, second = waiters.register("m1"), waiters.register("m1")
        other = waiters.register("m2")
        recorder = threading.Thread(target=waiters.notify, args=([("m1", Ending.RESULT, b"x")],))
        recorder.start()
        got = await asyncio.gather(waiters.wait(first, 30), waiters.wait(second, 30))
        recorder.join()
        return got, await waiters.wait(other, 0.01)

    got, nothing = asyncio.run(scenario())
    assert got == [(Ending.RESULT, b"x")] * 2
    assert nothing is None                      # m2 has no outcome yet
    assert len(waiters) == 1                    # m2 still waits; m1's waiters are gone


def test_a_forgotten_waiter_is_not_woken_and_the_others_still_are():
    waiters = OutcomeWaiters()

    async def scenario():
        gone, kept = waiters.register("m"), waiters.register("m")
        waiters.forget("m", gone)
        waiters.notify([("m", Ending.DEAD, b"")])
        return gone.done(), await waiters.wait(kept, 30)

    gone_done, kept_got = asyncio.run(scenario())
    assert not gone_done and kept_got == (Ending.DEAD, b"")
    waiters.forget("never", None)               # nothing to forget: no error
    waiters.notify([("nobody", Ending.RESULT, b"")])
    assert len(waiters) == 0


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
