import asyncio

import pytest

from rayq.core.kit.clock import FakeClock
from rayq.core.kit.renewed import MISSING, Refreshed, Renewed


def test_nothing_kept_is_read_now_and_a_fresh_value_is_not_renewed():
    cache = Renewed(ttl_s=2.0)
    assert cache.get("q", now=0.0) == (MISSING, False)
    assert cache.keep("q", 0.0, "v1") == "v1"
    assert cache.get("q", now=0.9) == ("v1", False)


def test_past_half_the_ttl_one_renewal_starts_and_the_value_still_serves():
    cache = Renewed(ttl_s=2.0)
    cache.keep("q", 0.0, "v1")
    assert cache.get("q", now=1.5) == ("v1", True)
    assert cache.get("q", now=1.6) == ("v1", False)  # under way
    cache.keep("q", 1.5, "v2")
    cache.renewed("q")
    assert cache.get("q", now=2.5) == ("v2", False)
    assert cache.get("q", now=3.0) == ("v2", True)  # the next one, once it ended


def test_past_the_ttl_the_value_is_read_again():
    cache = Renewed(ttl_s=2.0)
    cache.keep("q", 0.0, "v1")
    assert cache.get("q", now=2.0) == (MISSING, False)


def test_a_read_begun_before_a_change_or_a_later_read_is_not_kept():
    cache = Renewed(ttl_s=2.0)
    cache.keep("q", 0.0, "old")
    cache.changed("q", now=1.0)
    assert cache.get("q", now=1.1) == (MISSING, False)
    cache.keep("q", 0.5, "read before the change")
    assert cache.get("q", now=1.2) == (MISSING, False)
    cache.keep("q", 1.2, "new")
    cache.keep("q", 1.1, "an older read landing late")
    assert cache.get("q", now=1.3) == ("new", False)


def test_kept_answers_within_the_ttl_and_asks_for_no_renewal():
    cache = Renewed(ttl_s=2.0)
    assert cache.kept("q", now=0.0) is MISSING and cache.read_at("q") is None
    cache.keep("q", 0.5, "v1")
    assert cache.kept("q", now=2.0) == "v1" and cache.read_at("q") == 0.5
    assert cache.get("q", now=2.0) == ("v1", True)  # kept() did not start the renewal
    assert cache.kept("q", now=2.5) is MISSING


# -- Refreshed: one value read again in the foreground ------------------------------------
class Source:
    """What a Refreshed value is read from: counts reads; a read may be held open."""

    def __init__(self):
        self.value, self.reads = "v1", 0
        self.hold: asyncio.Event | None = None
        self.reading = asyncio.Event()

    async def read(self):
        self.reads += 1
        value = self.value
        self.reading.set()
        if self.hold is not None:
            await self.hold.wait()
        return value


def refreshed(source, clock, min_gap_s=0.01) -> Refreshed:
    return Refreshed(source.read, None, clock, max_age_s=30.0, min_gap_s=min_gap_s)


def test_a_value_is_read_when_missing_and_again_only_once_it_is_older_than_max_age():
    async def scenario():
        clock, source = FakeClock(), Source()
        value = refreshed(source, clock)
        assert await value.fresh() and value.value == "v1"
        source.value = "v2"
        clock.advance(29.9)
        assert not await value.fresh() and value.value == "v1"
        clock.advance(0.1)
        assert await value.fresh() and value.value == "v2"
        return source.reads
    assert asyncio.run(scenario()) == 2


def test_callers_that_come_while_a_read_is_under_way_share_it():
    async def scenario():
        source = Source()
        source.hold = asyncio.Event()
        value = refreshed(source, FakeClock())
        first = asyncio.ensure_future(value.fresh())
        await source.reading.wait()
        others = [asyncio.ensure_future(value.fresh(force=f)) for f in (False, True, False)]
        await asyncio.sleep(0)
        source.hold.set()
        assert await first and all(await asyncio.gather(*others))
        return source.reads
    assert asyncio.run(scenario()) == 1


def test_a_forced_read_waits_out_the_gap_since_the_last_read():
    async def scenario():
        clock, source = FakeClock(), Source()
        value = refreshed(source, clock, min_gap_s=0.05)
        await value.fresh()
        loop = asyncio.get_running_loop()
        started = loop.time()
        source.value = "v2"
        assert await value.fresh(force=True) and value.value == "v2"
        waited = loop.time() - started
        clock.advance(1.0)  # a gap later: at once
        started = loop.time()
        await value.fresh(force=True)
        return waited, loop.time() - started, source.reads
    waited, then, reads = asyncio.run(scenario())
    assert waited >= 0.04 and then < 0.04 and reads == 3


def test_a_read_under_way_when_the_value_is_forgotten_is_not_kept():
    async def scenario():
        source = Source()
        source.hold = asyncio.Event()
        value = refreshed(source, FakeClock())
        pending = asyncio.ensure_future(value.fresh())
        await source.reading.wait()
        source.value = "v2"  # changed at the source after the read took its copy...
        value.forget()       # ...and the source says so
        source.hold.set()
        assert await pending
        return value.value, source.reads
    assert asyncio.run(scenario()) == ("v2", 2)


def test_a_forgotten_value_stays_readable_until_the_next_read():
    async def scenario():
        clock, source = FakeClock(), Source()
        value = refreshed(source, clock)
        await value.fresh()
        value.forget()
        kept = value.value
        source.value = "v2"
        assert await value.fresh()  # due at once, and no gap to wait out
        return kept, value.value, source.reads
    assert asyncio.run(scenario()) == ("v1", "v2", 2)


def test_a_failed_read_fails_its_callers_and_the_next_call_reads_again():
    async def scenario():
        source, failing = Source(), True

        async def read():
            if failing:
                raise RuntimeError("the source is away")
            return await source.read()
        value = Refreshed(read, None, FakeClock(), max_age_s=30.0, min_gap_s=0.01)
        with pytest.raises(RuntimeError):
            await value.fresh()
        failing = False
        assert await value.fresh() and value.value == "v1"
    asyncio.run(scenario())
