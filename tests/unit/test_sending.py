"""The send coalescer: concurrent senders share one flush, each gets its own results,
and a coalescer keeps no reference to the flush (so to the client) it was led with."""

import gc
import threading
import time
import weakref

import pytest

from rayq.sending import SendCoalescer


class Owner:
    """Stands for a client's transport: a put call that records each flush it makes."""

    def __init__(self, release: threading.Event | None = None):
        self.flushes: list[list] = []
        self.release = release

    def flush(self, messages: list) -> list:
        release, self.release = self.release, None
        if release is not None:
            release.wait(10)  # hold the first flush so the others queue behind it
        self.flushes.append(list(messages))
        return [f"id-{m}" for m in messages]


def test_senders_waiting_behind_a_flush_share_the_next_one_and_get_their_own_ids():
    release = threading.Event()
    owner, coalescer = Owner(release), SendCoalescer(max_in_flight=1)
    results = {}

    def send(n):
        results[n] = coalescer.send([n, n + 100], owner.flush)

    leader = threading.Thread(target=send, args=(0,))
    leader.start()
    followers = [threading.Thread(target=send, args=(n,)) for n in (1, 2, 3)]
    for t in followers:
        t.start()
    deadline = time.monotonic() + 10
    while len(coalescer) < 3 and time.monotonic() < deadline:  # followers queued
        time.sleep(0.001)
    release.set()
    for t in [leader, *followers]:
        t.join(10)
    assert results == {n: [f"id-{n}", f"id-{n + 100}"] for n in range(4)}
    assert len(owner.flushes) == 2 and sorted(owner.flushes[1]) == [1, 2, 3, 101, 102, 103]


def test_with_two_flushes_in_flight_a_sender_is_not_held_behind_a_slow_flush():
    release = threading.Event()
    owner, coalescer = Owner(release), SendCoalescer(max_in_flight=2)
    first = threading.Thread(target=coalescer.send, args=([0], owner.flush))
    first.start()
    deadline = time.monotonic() + 10
    while owner.release is not None and time.monotonic() < deadline:  # first flush held
        time.sleep(0.001)
    assert coalescer.send([1], owner.flush) == ["id-1"]  # went out while the first is held
    release.set()
    first.join(10)
    assert owner.flushes == [[1], [0]]


def test_a_failed_flush_reaches_every_sender_of_it():
    def broken(messages):
        raise RuntimeError("shard gone")

    with pytest.raises(RuntimeError, match="shard gone"):
        SendCoalescer().send([1], broken)


def test_a_coalescer_does_not_keep_its_owner_alive():
    owner, coalescer = Owner(), SendCoalescer()
    assert coalescer.send(["m"], owner.flush) == ["id-m"]
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None and coalescer.send(["n"], Owner().flush) == ["id-n"]


def test_a_sender_answered_in_a_loop_joins_the_next_flush_whole():
    """Eight threads sending in a loop: each flush after the first carries (nearly) all
    of them, not the one that arrived during the previous flush and then the rest."""
    owner, coalescer = Owner(), SendCoalescer(max_in_flight=1)

    def slow_flush(messages):
        time.sleep(0.002)  # a put's round trip
        return owner.flush(messages)

    def loop(n):
        for i in range(20):
            assert coalescer.send([(n, i)], slow_flush) == [f"id-{(n, i)}"]

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sizes = [len(f) for f in owner.flushes]
    assert sum(sizes) == 160
    assert sorted(sizes)[len(sizes) // 2] >= 6  # median flush: most of the eight senders


def test_many_leaders_never_lose_the_lead():
    """With several flushes in flight, a sender handed the lead after another leader
    took its messages still leads (or gives the lead back): nobody waits forever."""
    owner, coalescer = Owner(), SendCoalescer(max_in_flight=3)
    done = []

    def loop(n):
        for i in range(50):
            coalescer.send([(n, i)], owner.flush)
        done.append(n)

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(done) == list(range(12))
    assert coalescer._batcher.in_flight == 0
    assert sum(len(f) for f in owner.flushes) == 600
