"""Steps driven blocking and awaited (rayq.steps), and the guard that keeps a blocking
runtime call off an event loop that must not wait (rayq.remote.NO_WAITING)."""

import asyncio

import pytest

from rayq.remote import NO_WAITING, WouldBlock, call, call_all
from rayq.steps import Request, drive, drive_async


def adding():
    """Two requests, the second's error handled: 1 + (2, or 0 when it raised)."""
    first = yield Request(None, "one")
    try:
        second = yield Request(None, "two")
    except KeyError:
        second = 0
    return first + second


def test_a_blocking_and_an_awaiting_driver_give_the_same_result():
    answers = {"one": 1, "two": 2}
    assert drive(adding(), lambda r: answers[r.handle]) == 3

    async def answer(r):
        return answers[r.handle]
    assert asyncio.run(drive_async(adding(), answer)) == 3


def test_a_requests_error_is_thrown_into_the_steps():
    def failing(r):
        if r.handle == "two":
            raise KeyError(r.handle)
        return 1
    assert drive(adding(), failing) == 1


def test_where_no_waiting_is_set_a_blocking_call_is_refused_before_it_is_made():
    made = []
    token = NO_WAITING.set(True)
    try:
        with pytest.raises(WouldBlock):
            call(lambda: made.append("call"))
        with pytest.raises(WouldBlock):
            call_all([lambda: made.append("call_all")])
    finally:
        NO_WAITING.reset(token)
    assert made == []
