"""Long polls parked on a shard's loop (actors.parking): a put of n wakes n, oldest first."""

import asyncio

from actors.parking import ParkedPolls
from tests.unit.loop import until


def test_a_put_of_one_wakes_the_oldest_poll_only_and_a_left_poll_is_forgotten():
    async def scenario():
        polls = ParkedPolls()
        first = asyncio.ensure_future(polls.park([1, 2], 3600))
        second = asyncio.ensure_future(polls.park([1], 3600))
        await until(lambda: polls.waiting(1) == 2)
        polls.wake(1, 1)
        await until(first.done)
        assert not second.done() and polls.waiting(1) == 1 and polls.waiting(2) == 0
        second.cancel()
        await until(lambda: polls.waiting(1) == 0)
    asyncio.run(scenario())


def test_a_poll_nobody_wakes_returns_when_its_time_is_up():
    async def scenario():
        polls = ParkedPolls()
        await polls.park([7], 0)
        assert polls.waiting(7) == 0
    asyncio.run(scenario())
