"""Which rows a receive hands out: a write batch's picking, over lazy per-key cursors.

With a listen order (the coordinator intervening) keys are taken in that order;
without one the shard's fair dispatch (:mod:`rayq.core.storage.dispatch`) ranks them, and a
key's cursor is opened only when its rank could beat the best open one.
:class:`PickOps` holds these operations; :class:`~rayq.core.storage.batch.WriteBatch` has them
as its own.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rayq.core.storage import layout as rows
from rayq.core.codec.model import PREFIX, ROW_KEY

if TYPE_CHECKING:
    from rayq.core.storage.batch import WriteBatch


class PickOps:
    """Picking the rows a receive (or a peek) hands out, as operations of a write batch."""

    def pick(self: "WriteBatch", sq: int, n: int, now_us: int, keys: Sequence[str] | None,
             max_receives: int | None, exclude: Sequence[str] | None = None) -> tuple[list, list]:
        """Find up to ``n`` deliverable rows; also the expired or dead rows stepped over.

        With ``keys`` (a listen order) take from the first key first; without, the
        shard's fair dispatch chooses (:mod:`rayq.core.storage.dispatch`). Reads only the
        visible head of each key's range, stepping over at most ``max_scan_rows``
        expired or dead rows in total. Keys in ``exclude`` are left alone (e.g. job
        types at their concurrency limit).
        """
        self._budget = self.config.max_scan_rows
        found: list = []
        skipped: list = []
        if keys is None:
            self._pick_dispatched(sq, n, now_us, max_receives, exclude, found, skipped)
            return found, skipped
        known = (self.key_id(name, create=False) for name in keys)
        for kid in dict.fromkeys(kid for kid in known if kid is not None):
            key_rows = _KeyRows(self, sq, kid, now_us, max_receives, skipped)
            while len(found) < n and (row := key_rows.next()) is not None:
                found.append(row)
            if len(found) >= n or self._budget <= 0:
                break
        return found, skipped

    def _pick_dispatched(self: "WriteBatch", sq: int, n: int, now_us: int, max_receives: int | None,
                         exclude: Sequence[str] | None, found: list, skipped: list) -> None:
        """Take rows one at a time from the key the dispatcher ranks first, re-ranking
        it after each take. The ready list is ordered by the committed state; a key's
        score only grows within a transaction, so a key is opened only when its
        committed score could beat the best open one: O((n + opened) log keys)."""
        dispatch = self.store.dispatch
        dispatch.due(now_us)
        skip = {self.key_id(name, create=False) for name in exclude or ()}
        heap: list = []
        tiebreak = itertools.count()
        opened: set[int] = set()

        def open_key(kid: int) -> None:
            opened.add(kid)
            if kid not in skip:
                key_rows = _KeyRows(self, sq, kid, now_us, max_receives, skipped)
                push(kid, key_rows, key_rows.next())

        def push(kid: int, key_rows: "_KeyRows", row) -> None:
            if row is not None:
                score = dispatch.score(sq, kid, ROW_KEY.unpack(row[0])[2:],
                                       self._taken[(sq, kid)] + key_rows.taken)
                heapq.heappush(heap, (score, next(tiebreak), kid, key_rows, row))

        for kid in list(self._touched[sq]):  # put in this transaction: maybe not ranked yet
            open_key(kid)
        ranked = (entry for entry in dispatch.ready(sq) if entry[1] not in opened)
        waiting = next(ranked, None)
        while len(found) < n and self._budget > 0:
            while waiting is not None and (not heap or waiting[0] < heap[0][0]):
                open_key(waiting[1])
                waiting = next(ranked, None)
            if not heap:
                return
            _, _, kid, key_rows, row = heapq.heappop(heap)
            found.append(row)
            key_rows.taken += 1
            if len(found) >= n:
                return
            if not heap and waiting is None:  # the only key left: no more ranking
                while len(found) < n and (row := key_rows.next()) is not None:
                    found.append(row)
                return
            push(kid, key_rows, key_rows.next())


class _KeyRows:
    """The deliverable rows of one (subqueue, key), oldest visible first, read lazily.
    Expired rows, and rows already received ``max_receives`` times, are stepped over
    into ``skipped`` (they count against the batch's scan budget)."""

    __slots__ = ("batch", "rows", "now_us", "max_receives", "skipped", "taken")

    def __init__(self, batch: "WriteBatch", sq: int, kid: int, now_us: int,
                 max_receives: int | None, skipped: list):
        self.batch, self.now_us, self.max_receives = batch, now_us, max_receives
        # keys only: a cached row's value comes from memory (docs/shards-and-storage.md),
        # others one get each
        self.rows = batch.txn.scan_keys("rows", PREFIX.pack(sq, kid), PREFIX.pack(sq, kid + 1))
        self.skipped, self.taken = skipped, 0

    def next(self) -> tuple[bytes, bytes] | None:
        batch = self.batch
        cache, txn = batch.store.cache, batch.txn
        for row_key in self.rows:
            if ROW_KEY.unpack(row_key)[2] > self.now_us:
                break  # hidden and delayed rows sort after every visible one
            batch.stats["rows_scanned"] += 1
            value = cache.get(row_key) or txn.get("rows", row_key)
            if rows.expires_us(value) <= self.now_us:
                self.skipped.append((row_key, value, "expired"))
            elif self.max_receives is not None and \
                    rows.DEQUEUE.unpack_from(value, 16)[0] >= self.max_receives:
                self.skipped.append((row_key, value, "dead"))
            else:
                return row_key, value
            batch._budget -= 1
            if batch._budget <= 0:
                break
        self.rows = iter(())
        return None
