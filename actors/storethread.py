"""The one thread that touches a shard's store, and when a small group commit skips it.

Every store call runs on one thread (:class:`StoreThread`), so a long transaction
never blocks the shard's event loop, and the loop reads the next calls meanwhile (they
make the next group commit). At low load that costs two thread hand-offs per request
for a commit of a few rows: a commit that
:func:`rayq.core.storage.operations.small_group` allows runs on the event loop
itself when the store thread has nothing to do, since nothing else can touch the store
while the loop is busy with it.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class StoreThread:
    """Runs store calls on the store's thread, or inline (see the module docstring).
    Used from the shard's event loop only."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._loop = asyncio.get_running_loop()
        self._queued = 0  # calls handed to the thread and not yet back

    async def run(self, fn: Callable[..., Any], *args: Any, inline: bool = False) -> Any:
        """``fn(*args)``; with ``inline``, on the event loop when the thread is idle."""
        if inline and self._queued == 0:
            return fn(*args)
        self._queued += 1
        try:
            return await self._loop.run_in_executor(self._pool, fn, *args)
        finally:
            self._queued -= 1
