"""Shard-local fair dispatch (rayq.core.storage.dispatch) through the store, on a fake clock.

The rules come from "How Amazon SQS fair queues work": quiet keys first; a key is
noisy over 10 % of in-flight messages (and at least 30) or of recent processing
time; among noisy keys the fewest in flight first; a key stops being noisy when
its backlog drains or it sends nothing for 5 minutes.
"""

from collections import Counter

import pytest

from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.model import NewMessage
from rayq.core.storage.store import ShardStore
from rayq.core.codec.wire import decode_delivered
from rayq.testing import FakeClock, memory_store, plenty_of_memory
from rayq.core.storage.writes import Delete, Put, Receive
from tests.contract.helpers import batch, received

SQ = 0


def put(store, key: str, n: int = 1, delay_s: float = 0.0) -> None:
    for start in range(0, n, 1000):
        messages = [NewMessage(b"\x00x", "t", "job", key, delay_s)
                    for _ in range(min(1000, n - start))]
        store.run(Put(SQ, batch(*messages)))


def keys_of(messages) -> list[str]:
    return [m.key for m in messages]


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    return memory_store(clock=clock)


def test_a_quiet_key_is_served_before_a_noisy_keys_older_backlog(store, clock):
    put(store, "noisy", 100)
    busy = received(store, SQ, 10, 30)
    clock.advance(1)
    store.run(Delete([m.receipt for m in busy]))  # ten seconds of processing time, all noisy's
    [change] = store.review_dispatch()
    assert (change.key, change.noisy, change.reason) == ("noisy", True, "processing-time share")
    clock.advance(1)
    put(store, "quiet-a")
    put(store, "quiet-b")
    assert keys_of(received(store, SQ, 3, 30)) == ["quiet-a", "quiet-b", "noisy"]


def test_processing_time_counts_handlers_still_running(store, clock):
    put(store, "first", 10)
    put(store, "second", 10)
    [done] = received(store, SQ, 1, 30, keys=["first"])
    running = received(store, SQ, 4, 30, keys=["second"])
    clock.advance(1)
    store.run(Delete([done.receipt]))  # first has finished one second; second runs four
    assert {(c.key, c.reason) for c in store.review_dispatch()} == {
        ("first", "processing-time share"), ("second", "processing-time share")}
    assert {k.key: round(k.usage_share, 2) for k in store.noisy()} == {"first": 0.2,
                                                                        "second": 0.8}
    store.run(Delete([m.receipt for m in running]))


def test_a_noisy_share_of_one_marks_no_key_noisy(clock):
    store = memory_store(clock=clock, dispatch=DispatchPolicy(noisy_share=1.0))
    put(store, "only", 100)
    done = received(store, SQ, 40, 30)
    clock.advance(1)
    store.run(Delete([m.receipt for m in done[:10]]))  # all the in-flight messages and time
    assert store.review_dispatch() == [] and store.noisy() == []


def test_a_key_holding_most_in_flight_messages_is_noisy_only_from_thirty_of_them(store, clock):
    put(store, "big", 100)
    put(store, "small", 100)
    received(store, SQ, 29, 30, keys=["big"])
    assert store.review_dispatch() == []
    received(store, SQ, 1, 30, keys=["big"])
    [change] = store.review_dispatch()
    assert (change.key, change.reason) == ("big", "in-flight share")
    assert [(k.key, k.inflight) for k in store.noisy()] == [("big", 30)]


def test_among_noisy_keys_the_one_with_fewest_in_flight_goes_first(store, clock):
    put(store, "a", 50)
    put(store, "b", 50)
    received(store, SQ, 40, 30, keys=["a"])
    received(store, SQ, 35, 30, keys=["b"])
    assert {c.key for c in store.review_dispatch()} == {"a", "b"}
    assert keys_of(received(store, SQ, 6, 30)) == ["b"] * 5 + ["a"]


def test_a_noisy_key_is_quiet_again_once_its_backlog_is_drained(store, clock):
    put(store, "noisy", 40)
    got = received(store, SQ, 40, 30)
    store.review_dispatch()
    assert [k.key for k in store.noisy()] == ["noisy"]
    store.run(Delete([m.receipt for m in got]))
    assert store.noisy() == []
    [change] = store.review_dispatch()
    assert (change.key, change.noisy, change.reason) == ("noisy", False, "drained")


def test_a_noisy_key_that_sent_nothing_for_five_minutes_is_quiet_again(store, clock):
    put(store, "noisy", 100)
    received(store, SQ, 40, 30)
    store.review_dispatch()
    clock.advance(299)
    assert store.review_dispatch() == []
    clock.advance(1)
    [change] = store.review_dispatch()
    assert (change.noisy, change.reason) == (False, "idle")


def test_dispatch_is_work_conserving_a_noisy_key_is_served_when_nothing_else_waits(store, clock):
    put(store, "noisy", 50)
    put(store, "quiet", 1)
    received(store, SQ, 40, 30, keys=["noisy"])
    store.review_dispatch()
    assert keys_of(received(store, SQ, 5, 30)) == ["quiet"] + ["noisy"] * 4


def test_a_lapsed_visibility_timeout_ends_the_flight(store, clock):
    put(store, "a", 5)
    put(store, "b", 5)
    received(store, SQ, 3, 10, keys=["a"])
    assert keys_of(received(store, SQ, 1, 30)) == ["b"]   # a holds 3, b none
    clock.advance(11)  # a's three come back, b's one is still out
    assert keys_of(received(store, SQ, 2, 30)) == ["a", "a"]


def test_one_group_spreads_its_receives_over_the_keys(store, clock):
    put(store, "a", 5)
    put(store, "b", 5)
    first, second = store.group([Receive(SQ, max_messages=1, visibility_timeout_s=30)] * 2)
    assert sorted(keys_of(decode_delivered(first) + decode_delivered(second))) == ["a", "b"]


def test_excluded_keys_are_passed_over(store, clock):
    put(store, "a", 2)
    put(store, "b", 2)
    assert keys_of(received(store, SQ, 4, 30, exclude=["a"])) == ["b", "b"]


def test_delayed_messages_join_the_dispatch_when_they_become_visible(store, clock):
    put(store, "later", 1, delay_s=5)
    put(store, "now", 1)
    assert keys_of(received(store, SQ, 5, 30)) == ["now"]
    clock.advance(5)
    assert keys_of(received(store, SQ, 5, 30)) == ["later"]


def simulate(store, clock, threads: int, ticks: int, seconds_of: dict[str, int]) -> Counter:
    """Threads that each take one message, hold it for its key's handler time in
    ticks of 0.1 s, delete it and take the next; returns thread-ticks per key."""
    running: list[tuple[int, object]] = []  # (tick it ends, message)
    used: Counter = Counter()
    for tick in range(ticks):
        done = [m for end, m in running if end <= tick]
        running = [(end, m) for end, m in running if end > tick]
        if done:
            store.run(Delete([m.receipt for m in done]))
        for m in received(store, SQ, threads - len(running), 60) if len(running) < threads else ():
            running.append((tick + seconds_of[m.key], m))
        for _, m in running:
            used[m.key] += 1
        clock.advance(0.1)
        if tick % 10 == 0:
            store.review_dispatch()
    return used


@pytest.mark.parametrize("costs", [{"gold": 2, "free": 2}, {"gold": 1, "free": 5}])
def test_weights_shape_each_keys_share_of_handler_time(clock, costs):
    store = memory_store(clock=clock, dispatch=DispatchPolicy(weights=(("gold", 4.0),)))
    put(store, "gold", 3000)
    put(store, "free", 3000)
    used = simulate(store, clock, threads=10, ticks=300, seconds_of=costs)  # none drains
    share = used["gold"] / (used["gold"] + used["free"])
    assert abs(share - 0.8) <= 0.08  # within 10 % of the weight's share


def test_without_weights_a_cheap_key_and_an_expensive_key_share_threads_evenly(clock, store):
    put(store, "heavy", 3000)
    put(store, "light", 3000)
    used = simulate(store, clock, threads=10, ticks=600, seconds_of={"heavy": 10, "light": 1})
    assert abs(used["heavy"] / (used["heavy"] + used["light"]) - 0.5) <= 0.05


def test_fifo_dispatch_lets_a_backlog_stand_in_front_of_a_quiet_key(clock):
    store = memory_store(clock=clock, dispatch=DispatchPolicy(mode="fifo"))
    put(store, "noisy", 20)
    clock.advance(1)
    put(store, "quiet")
    assert keys_of(received(store, SQ, 21, 30))[-1] == "quiet"


def test_a_receive_over_ten_thousand_keys_reads_a_handful_of_rows(store, clock):
    for chunk in range(0, 10_000, 1000):  # two messages for each of 10 000 keys
        keys = [f"tenant-{i}" for i in range(chunk, chunk + 1000)]
        store.run(Put(SQ, batch(*[NewMessage(b"\x00x", "t", "job", key) for key in keys])))
        store.run(Put(SQ, batch(*[NewMessage(b"\x00x", "t", "job", key) for key in keys])))
    scanned = store.stats().rows_scanned
    served = Counter()
    for _ in range(10_000):
        [m] = received(store, SQ, 1, 30)
        served[m.key] += 1
    # every key once before any key twice, reading at most one row per receive
    assert len(served) == 10_000 and set(served.values()) == {1}
    assert store.stats().rows_scanned - scanned == 10_000


def test_a_reopened_shard_dispatches_what_it_had_stored(tmp_path, clock):
    def open_():
        return ShardStore(LmdbKV(tmp_path / "shard"), clock=clock, memory_probe=plenty_of_memory)
    store = open_()
    put(store, "a", 2)
    put(store, "b", 1, delay_s=5)
    store.close()
    store = open_()
    assert keys_of(received(store, SQ, 5, 30)) == ["a", "a"]
    clock.advance(5)
    assert keys_of(received(store, SQ, 5, 30)) == ["b"]


def test_with_nothing_in_flight_the_key_with_less_recent_processing_time_goes_first(store, clock):
    put(store, "busy", 5)
    clock.advance(1)
    put(store, "idle", 1)
    [m] = received(store, SQ, 1, 30)
    clock.advance(2)
    store.run(Delete([m.receipt]))  # busy has two seconds of processing time, nothing in flight
    assert keys_of(received(store, SQ, 1, 30)) == ["idle"]  # no review needed


def test_recent_processing_time_fades_and_survives_a_rescale_after_days(store, clock):
    for day in range(3):
        put(store, "a", 2)
        put(store, "b", 1)
        [m] = received(store, SQ, 1, 30, keys=["a"])
        clock.advance(5)
        store.run(Delete([m.receipt]))
        assert keys_of(received(store, SQ, 2, 30)) == ["b", "a"]
        clock.advance(86_400)  # past the rescale of the decay's epoch
        store.run(Delete([r.receipt for r in received(store, SQ, 10, 30)]))
