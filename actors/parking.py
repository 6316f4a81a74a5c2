"""Where a shard's long polls wait: parked per subqueue until a put wakes them (one
waiter per message put, no herd), a hidden or delayed message comes due, or their
time is up."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque


class ParkedPolls:
    """Long polls parked on this event loop, oldest first per subqueue."""

    def __init__(self):
        self._parked: dict[int, deque[asyncio.Future]] = defaultdict(deque)

    def waiting(self, subqueue: int) -> int:
        """How many polls wait on ``subqueue``."""
        return len(self._parked.get(subqueue, ()))

    def wake(self, subqueue: int, count: int) -> None:
        """Wake up to ``count`` polls parked on ``subqueue`` (no herd: one each)."""
        parked = self._parked.get(subqueue)
        while parked and count > 0:
            future = parked.popleft()
            if not future.done():
                future.set_result(None)
                count -= 1

    async def park(self, subqueues: list[int], timeout_s: float) -> None:
        """Wait until a put to one of ``subqueues`` wakes this poll or ``timeout_s``
        passes (the caller shortens it to when a hidden or delayed message comes due)."""
        future = asyncio.get_running_loop().create_future()
        for sq in subqueues:
            self._parked[sq].append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            for sq in subqueues:
                parked = self._parked.get(sq)
                if parked and future in parked:
                    parked.remove(future)
