"""The memory-pressure-aware cache: when it bypasses, how often it probes, what it counts."""

import pytest

from rayq.config import StoreConfig
from rayq.core.storage import layout
from rayq.core.storage.cache import ENTRY_OVERHEAD_BYTES, MemoryReading, MessageCache, PressureMonitor
from rayq.core.codec.model import NewMessage, decode_body, encode_body
from rayq.testing import FakeClock, memory_store
from rayq.core.storage.writes import Clear, CollectExpired, Put
from tests.contract.helpers import batch, received

MiB = 1 << 20


class Probe:
    """A memory probe whose reading the test sets, counting how often it is read."""

    def __init__(self, rss_bytes=100 * MiB, available_bytes=4096 * MiB):
        self.reading = MemoryReading(rss_bytes, available_bytes)
        self.reads = 0

    def set(self, rss_bytes=100 * MiB, available_bytes=4096 * MiB):
        self.reading = MemoryReading(rss_bytes, available_bytes)

    def __call__(self) -> MemoryReading:
        self.reads += 1
        return self.reading


def monitor(probe, clock, *, budget_bytes=1000, process_limit_bytes=200 * MiB,
            min_available_bytes=256 * MiB, check_interval_s=0.25) -> PressureMonitor:
    return PressureMonitor(clock, budget_bytes=budget_bytes,
                           process_limit_bytes=process_limit_bytes,
                           min_available_bytes=min_available_bytes,
                           check_interval_s=check_interval_s, probe=probe)


@pytest.mark.parametrize("cache_bytes, rss_mib, available_mib, limit_mib, pressure", [
    (0, 100, 4096, 200, False),
    (999, 100, 4096, 200, False),
    (1000, 100, 4096, 200, True),     # cache at its budget
    (5000, 100, 4096, 200, True),     # cache over its budget
    (0, 200, 4096, 200, False),       # process exactly at its limit
    (0, 201, 4096, 200, True),        # process over its limit
    (0, 10_000, 4096, None, False),   # no process limit
    (0, 100, 256, 200, False),        # exactly the minimum available
    (0, 100, 255, 200, True),         # machine short of memory
])
def test_pressure_is_cache_over_budget_process_over_limit_or_machine_short(
        cache_bytes, rss_mib, available_mib, limit_mib, pressure):
    probe = Probe(rss_mib * MiB, available_mib * MiB)
    limit = None if limit_mib is None else limit_mib * MiB
    watch = monitor(probe, FakeClock(), process_limit_bytes=limit)
    assert watch.under_pressure(cache_bytes) is pressure


def test_the_probe_is_read_at_most_once_per_check_interval():
    probe, clock = Probe(), FakeClock()
    watch = monitor(probe, clock, check_interval_s=0.25)
    for _ in range(100):
        watch.under_pressure(0)
    assert probe.reads == 1
    clock.advance(0.2499)
    watch.under_pressure(0)
    assert probe.reads == 1
    clock.advance(0.0001)
    watch.under_pressure(0)
    assert probe.reads == 2


def test_a_reading_holds_until_the_next_check():
    probe, clock = Probe(), FakeClock()
    watch = monitor(probe, clock)
    assert not watch.under_pressure(0)
    probe.set(available_bytes=0)
    assert not watch.under_pressure(0)
    clock.advance(0.25)
    assert watch.under_pressure(0)
    probe.set()
    assert watch.under_pressure(0)
    clock.advance(0.25)
    assert not watch.under_pressure(0)


def test_the_budget_is_checked_without_reading_the_probe():
    probe = Probe()
    assert monitor(probe, FakeClock(), budget_bytes=10).under_pressure(10)
    assert probe.reads == 0


def entry_size(body: bytes, key: bytes) -> int:
    return len(body) + len(key) + ENTRY_OVERHEAD_BYTES


def test_a_cache_over_its_budget_bypasses_new_entries_until_it_shrinks():
    body = b"x" * 100
    cache = MessageCache(monitor(Probe(), FakeClock(), budget_bytes=2 * entry_size(body, b"k0")))
    assert [cache.add(f"k{i}".encode(), body) for i in range(3)] == [True, True, False]
    assert cache.stats().bytes == 2 * entry_size(body, b"k0")
    assert cache.take(b"k0") == body
    assert cache.add(b"k3", body)
    stats = cache.stats()
    assert (stats.entries, stats.hits, stats.bypasses, stats.pressure_episodes) == (2, 1, 1, 1)


@pytest.mark.parametrize("readings, episodes", [
    ([False, False, False], 0),
    ([True], 1),
    ([True, True, True], 1),
    ([True, False, True], 2),
    ([False, True, False, True, True, False], 2),
])
def test_pressure_episodes_count_transitions_into_pressure(readings, episodes):
    probe, clock = Probe(), FakeClock()
    cache = MessageCache(monitor(probe, clock, check_interval_s=1))
    for under in readings:
        probe.set(available_bytes=0 if under else 4096 * MiB)
        cache.add(b"k", b"v")
        cache.discard(b"k")
        clock.advance(1)
    stats = cache.stats()
    assert stats.pressure_episodes == episodes
    assert stats.bypasses == sum(readings)
    assert stats.under_pressure is readings[-1]


def test_take_counts_hits_and_misses_and_discard_frees_bytes():
    cache = MessageCache(monitor(Probe(), FakeClock(), budget_bytes=1 << 20))
    cache.add(b"a", b"row a")
    cache.add(b"b", b"row b")
    assert cache.get(b"a") == b"row a"
    assert cache.take(b"a") == b"row a"
    assert cache.take(b"a") is None
    cache.discard(b"b")
    cache.discard(b"never there")
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.bytes) == (1, 1, 0, 0)


# -- at store level ---------------------------------------------------------------------
def message(value) -> NewMessage:
    return NewMessage(encode_body(value, 1 << 20), "acme", "report", "k")


def test_messages_put_under_pressure_are_still_delivered_from_storage():
    probe, clock = Probe(available_bytes=0), FakeClock()
    store = memory_store(StoreConfig(), clock, probe)
    store.run(Put(0, batch(*[message(i) for i in range(3)])))
    assert [decode_body(m.body) for m in received(store, 0, 10, 30)] == [0, 1, 2]
    stats = store.stats().cache
    assert (stats.entries, stats.hits, stats.misses, stats.bypasses) == (0, 0, 3, 3)
    assert stats.pressure_episodes == 1 and stats.under_pressure


def test_the_cache_serves_receives_again_once_pressure_is_gone():
    probe, clock = Probe(available_bytes=0), FakeClock()
    store = memory_store(StoreConfig(pressure_check_interval_s=1), clock, probe)
    store.run(Put(0, batch(message("under pressure"))))
    probe.set()
    clock.advance(1)
    store.run(Put(0, batch(message("relieved"))))
    got = received(store, 0, 10, 30)
    assert [decode_body(m.body) for m in got] == ["under pressure", "relieved"]
    stats = store.stats().cache
    assert (stats.hits, stats.misses, stats.bypasses, stats.under_pressure) == (1, 1, 1, False)


def test_a_store_cache_stops_growing_at_its_budget():
    body_len = 1000
    store = memory_store(StoreConfig(cache_budget_bytes=5 * body_len), FakeClock(), Probe())
    store.run(Put(0, batch(*[message(b"x" * body_len) for _ in range(20)])))
    stats = store.stats().cache
    assert stats.entries < 6 and stats.bypasses == 20 - stats.entries
    assert stats.bytes <= 5 * body_len + entry_size(b"x" * (body_len + 1), b"k" * 24)
    assert len(received(store, 0, 20, 30)) == 20


def test_received_deleted_and_expired_messages_leave_the_cache():
    clock = FakeClock()
    store = memory_store(StoreConfig(), clock, Probe())
    store.run(Put(0, batch(message(1), message(2))))
    store.run(Put(1, batch(NewMessage(encode_body(3, 100), "acme", "report", "k", ttl_s=1))))
    store.run(Put(2, batch(message(4))))
    received(store, 0, 1, 30)
    store.run(Clear(2))
    clock.advance(1)
    store.run(CollectExpired())
    stats = store.stats().cache
    assert (stats.entries, stats.hits) == (1, 1)
    row = layout.HEAD.size + len(b"acme" + b"report") + len(encode_body(2, 100))  # header, names, body
    assert stats.bytes == ENTRY_OVERHEAD_BYTES + 24 + row
