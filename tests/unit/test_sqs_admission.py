"""An SQS replica's shares: one account's requests and threads are bounded, request
bodies in memory are bounded (a long poll waiting without a thread: test_receive_async.py)."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from rayq.sqs.admission import BodyBudget, Shares
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
