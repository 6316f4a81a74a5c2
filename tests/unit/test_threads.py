import asyncio
import threading

import pytest

from rayq.core.kit.threads import CallThreads


def test_calls_run_at_once_on_threads_of_their_own_up_to_the_cap():
    async def go():
        threads = CallThreads(3, "t")
        gate, arrived = threading.Barrier(3, timeout=30), []

        def meet(i):
            arrived.append(threading.get_ident())
            gate.wait()  # only three calls running at once pass it
            return i * 2

        values = await asyncio.gather(*(threads.run(lambda i=i: meet(i)) for i in range(3)))
        assert values == [0, 2, 4] and len(set(arrived)) == 3
        later = await asyncio.gather(*(threads.run(threading.get_ident) for _ in range(20)))
        assert set(later) <= set(arrived) and threads.started == 3  # idle threads reused
    asyncio.run(go())


def test_a_calls_exception_is_raised_to_its_waiter_and_its_thread_goes_on():
    class Stop(BaseException):
        pass

    def stop():
        raise Stop("stopped")

    async def go():
        threads = CallThreads(1, "t")
        with pytest.raises(Stop, match="stopped"):
            await threads.run(stop)
        with pytest.raises(ZeroDivisionError):
            await threads.run(lambda: 1 / 0)
        assert await threads.run(lambda: "next") == "next" and threads.started == 1
    asyncio.run(go())


def test_a_waiter_cancelled_leaves_the_thread_free_for_the_next_call():
    async def go():
        threads = CallThreads(1, "t")
        release = threading.Event()
        waiting = asyncio.ensure_future(threads.run(lambda: release.wait(30)))
        await asyncio.sleep(0)
        waiting.cancel()
        release.set()
        assert await threads.run(lambda: 7) == 7
    asyncio.run(go())


def test_a_pool_needs_a_thread():
    with pytest.raises(ValueError):
        CallThreads(0, "t")
