"""Driving an event loop in unit tests without sleeping on the clock."""

import asyncio


async def until(predicate) -> None:
    """Let the loop run until ``predicate()`` holds (bounded in loop turns, not time: a
    test that would hang fails instead)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")
