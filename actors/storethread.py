"""The one thread that touches a shard's store, and when a small group commit skips it.

Every store call runs on one thread (:class:`StoreThread`), so a long transaction
never blocks the shard's event loop, and the loop reads the next calls meanwhile (they
make the next group commit). At low load that costs two thread hand-offs per request
for a commit of a few rows: a commit that
:func:`rayq.core.storage.writes.small_group` allows runs on the shard's event loop
itself when the store thread has nothing to do. A lock held around every store call,
on either side, keeps it one call at a time (the shard's outcome waiters call in from
the event loop of their own concurrency group).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable


class StoreThread:
    """Runs store calls on the store's thread, or inline (see the module docstring)."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._loop = asyncio.get_running_loop()  # the shard's own: the one that may go inline
        self._store = threading.Lock()            # held by whoever runs a store call

    async def run(self, fn: Callable[..., Any], *args: Any, inline: bool = False) -> Any:
        """``fn(*args)``; with ``inline``, on the shard's event loop when the store is idle
        (called from any event loop of the shard's)."""
        if inline and asyncio.get_running_loop() is self._loop \
                and self._store.acquire(blocking=False):
            try:
                return fn(*args)
            finally:
                self._store.release()
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._locked,
                                                                fn, *args)

    def _locked(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._store:
            return fn(*args)
