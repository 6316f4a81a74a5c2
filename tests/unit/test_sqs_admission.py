"""An SQS replica's shares: one account's requests and threads are bounded, request
bodies in memory are bounded (a long poll waiting without a thread: test_receive_async.py)."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from rayq.sqs.admission import (OFF_LOOP_BYTES, BodyBudget, Shares, Unverified, announced_size,
                                 off_loop, peer_of)
from rayq.sqs.errors import SqsError


def test_an_account_past_its_share_of_requests_is_throttled_and_others_are_not():
    shares = Shares(in_flight_per_account=2, threads_per_account=1)
    with shares.admit("acme"), shares.admit("acme"):
        with pytest.raises(SqsError) as info:
            with shares.admit("acme"):
                pass
        assert info.value.code == "RequestThrottled" and info.value.status == 400
        with shares.admit("beta"):
            assert shares.in_flight("beta") == 1
    assert shares.in_flight("acme") == 0


def test_an_account_holds_at_most_its_share_of_threads_and_another_still_gets_one():
    import threading
    shares = Shares(in_flight_per_account=10, threads_per_account=2)
    lock, running, most = threading.Lock(), [0], {}
    release = threading.Event()

    def work(account):
        with lock:
            running[0] += 1
            most[account] = max(most.get(account, 0), running[0])
        if account == "acme":
            release.wait(30)  # a stuck call of acme's
        with lock:
            running[0] -= 1

    async def scenario():
        pool = ThreadPoolExecutor(8)
        stuck = [asyncio.ensure_future(shares.in_thread("acme", pool, work, "acme"))
                 for _ in range(6)]
        await shares.in_thread("beta", pool, work, "beta")  # not behind acme's six
        release.set()
        await asyncio.gather(*stuck)
        pool.shutdown()
    asyncio.run(scenario())
    assert most["beta"] <= 3  # acme held 2 threads at most when beta ran


def test_bodies_past_the_byte_budget_are_refused_until_one_is_done():
    budget = BodyBudget(limit_bytes=100)
    with budget.hold(60):
        with pytest.raises(SqsError) as info:
            with budget.hold(41):
                pass
        assert info.value.status == 503
    with budget.hold(100):
        assert budget.held_bytes == 100


def test_one_owners_receipt_forwards_never_push_out_anothers():
    from rayq.sqs.admission import Forwards
    forwards = Forwards(per_owner=3)
    forwards.put("quiet", "h-quiet", "r-quiet")
    for i in range(100):
        forwards.put("noisy", f"h{i}", f"r{i}")
    assert forwards.get("quiet", "h-quiet") == "r-quiet"
    assert [forwards.get("noisy", f"h{i}") for i in (96, 97, 98, 99)] == [None, "r97", "r98", "r99"]
    assert forwards.get("quiet", "h97") is None  # and owners never read each other's


def test_a_peer_holds_at_most_its_share_of_unverified_requests_and_another_peer_is_untouched():
    unverified = Unverified(per_peer=2)
    with unverified.hold("10.0.0.7"), unverified.hold("10.0.0.7"):
        with pytest.raises(SqsError) as info:
            with unverified.hold("10.0.0.7"):
                pass
        assert info.value.code == "ServiceUnavailable" and info.value.status == 503
        with unverified.hold("10.0.0.8"), unverified.hold("::ffff:10.0.0.9"):
            assert unverified.held("10.0.0.8") == unverified.held("10.0.0.9") == 1
    assert unverified.held("10.0.0.7") == 0


@pytest.mark.parametrize("remote, peer", [
    ("192.0.2.1", "192.0.2.1"), ("::ffff:192.0.2.1", "192.0.2.1"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"), ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    (None, ""), ("not an address", "not an address"),
])
def test_an_ipv6_host_counts_as_its_slash_64(remote, peer):
    assert peer_of(remote) == peer


@pytest.mark.parametrize("length, exists, answer", [
    (None, False, 0), (0, False, 0), (100, True, 100), (8 << 20, True, 8 << 20),
    ((8 << 20) + 1, True, ("RequestEntityTooLarge", 413)),
    (None, True, ("MissingContentLength", 411)),
])
def test_a_body_is_sized_from_its_announced_length_before_it_is_read(length, exists, answer):
    if isinstance(answer, int):
        assert announced_size(length, exists, 8 << 20) == answer
    else:
        with pytest.raises(SqsError) as info:
            announced_size(length, exists, 8 << 20)
        assert (info.value.code, info.value.status) == answer


def test_a_large_body_is_hashed_on_a_worker_thread_and_a_small_one_on_the_loop():
    import threading

    def where(_data):
        return threading.current_thread().name

    async def scenario():
        with ThreadPoolExecutor(1, thread_name_prefix="sqs") as pool:
            small = await off_loop(OFF_LOOP_BYTES, pool, where, b"")
            large = await off_loop(OFF_LOOP_BYTES + 1, pool, where, b"")
        return small, large

    small, large = asyncio.run(scenario())
    assert small == threading.current_thread().name  # the loop's thread
    assert large.startswith("sqs")
