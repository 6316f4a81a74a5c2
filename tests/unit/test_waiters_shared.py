"""Several calls waiting on the same task's outcome (rayq.core.storage.waiters): one that
leaves does not take the others' wake-ups with it."""

import asyncio

from rayq.core.codec.model import Ending
from rayq.core.storage.waiters import OutcomeWaiters
from tests.unit.loop import until


class Table:
    """An outcomes table where nothing has ended; counts its reads."""

    def __init__(self):
        self.reads = 0

    async def read(self, ids):
        self.reads += 1
        return [None] * len(ids)


def scenario(leaving: list[int], staying: list[int]):
    """Waiters on message "a"; those in ``leaving`` are cancelled, then "a" ends. Returns
    the outcomes the others got and the reads. ``recheck_s`` is an hour: only a wake-up
    can answer them."""
    table = Table()
    waiters = OutcomeWaiters(table.read, recheck_s=3600)

    async def run():
        calls = {n: asyncio.ensure_future(waiters.wait(["a"])) for n in leaving + staying}
        await until(lambda: waiters.waiting("a") == len(calls))   # all registered
        for n in leaving:
            calls[n].cancel()
        await until(lambda: all(calls[n].done() for n in leaving))
        waiters.notify([("a", Ending.RESULT, b"1")])
        rest = [calls[n] for n in staying]
        await until(lambda: all(c.done() for c in rest))
        return [c.result() for c in rest], table.reads

    return asyncio.run(run())


def test_the_other_waiters_of_a_task_are_woken_after_one_leaves():
    got, reads = scenario(leaving=[0], staying=[1, 2])
    assert got == [[(Ending.RESULT, b"1")]] * 2
    assert reads == 0                       # woken, never read


def test_the_first_waiter_is_woken_after_a_later_one_leaves():
    got, _ = scenario(leaving=[1], staying=[0])
    assert got == [[(Ending.RESULT, b"1")]]


def test_waiters_that_all_left_leave_nothing_registered():
    got, _ = scenario(leaving=[0, 1], staying=[])
    assert got == []


def test_an_end_told_before_a_wait_is_found_without_a_read():
    table = Table()
    waiters = OutcomeWaiters(table.read, recheck_s=3600)

    async def run():
        waiters.notify([("a", Ending.RESULT, b"1")])
        return await waiters.wait(["a"])

    assert asyncio.run(run()) == [(Ending.RESULT, b"1")]
    assert table.reads == 0


def test_a_wait_without_news_reads_the_table_and_takes_what_it_finds():
    class Ended(Table):
        async def read(self, ids):
            self.reads += 1
            return [(Ending.RESULT, b"2") if mid == "b" else False for mid in ids]

    table = Ended()
    waiters = OutcomeWaiters(table.read, recheck_s=0.01)
    assert asyncio.run(waiters.wait(["b", "lost"])) == [(Ending.RESULT, b"2"), False]
    assert table.reads == 1
    assert waiters.waiting("b") == 0


def test_the_ends_kept_for_late_waits_are_bounded_in_number_and_bytes(monkeypatch):
    from rayq.core.storage import waiters as module
    monkeypatch.setattr(module, "RECENT_KEPT", 3)
    monkeypatch.setattr(module, "RECENT_KEPT_BYTES", 10)
    kept = OutcomeWaiters(Table().read, recheck_s=3600)
    kept.notify([(str(i), Ending.RESULT, b"x") for i in range(5)])
    assert list(kept._recent) == ["2", "3", "4"]
    kept.notify([("big", Ending.RESULT, b"y" * 9)])
    assert list(kept._recent) == ["4", "big"] and kept._recent_bytes == 10
