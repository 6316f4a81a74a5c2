"""Which rows a receive (or a peek) hands out, over lazy per-key cursors.

With a listen order (the coordinator intervening) keys are taken in that order;
without one the shard's fair dispatch (:mod:`rayq.core.storage.dispatch`) ranks them, and a
key's cursor is opened only when its rank could beat the best open one.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from rayq.core.storage import layout
from rayq.core.storage.ledger import Env, Ledger, locked_until


class Skip(Enum):
    """Why a row a receive stepped over was not deliverable."""

    EXPIRED = "expired"
    DEAD = "dead"  # received max_receives times already
    CANCELLED = "cancelled"  # cancelled while a consumer held it, and that consumer is gone


class Skipped(NamedTuple):
    row_key: bytes
    value: bytes
    reason: Skip


class _Budget:
    """Rows a receive may step over (expired or dead) before it stops looking."""

    __slots__ = ("left",)

    def __init__(self, left: int):
        self.left = left


def pick(w: Ledger, env: Env, sq: int, n: int, now_us: int, keys: Sequence[str] | None,
         max_receives: int | None, exclude: Sequence[str] | None = None
         ) -> tuple[list[tuple[bytes, bytes]], list[Skipped]]:
    """Find up to ``n`` deliverable rows; also the expired or dead rows stepped over.

    With ``keys`` (a listen order) take from the first key first; without, the
    shard's fair dispatch chooses. Reads only the visible head of each key's range,
    stepping over at most ``max_scan_rows`` expired or dead rows in total. Keys in
    ``exclude`` are left alone (e.g. job types at their concurrency limit).
    """
    budget = _Budget(env.config.max_scan_rows)
    found: list = []
    skipped: list = []
    if keys is None:
        _pick_dispatched(w, env, sq, n, now_us, max_receives, exclude, found, skipped, budget)
        return found, skipped
    known = (w.key_id(name, create=False) for name in keys)
    for kid in dict.fromkeys(kid for kid in known if kid is not None):
        key_rows = _KeyRows(w, env, sq, kid, now_us, max_receives, skipped, budget)
        while len(found) < n and (row := key_rows.next()) is not None:
            found.append(row)
        if len(found) >= n or budget.left <= 0:
            break
    return found, skipped


def _pick_dispatched(w: Ledger, env: Env, sq: int, n: int, now_us: int,
                     max_receives: int | None, exclude: Sequence[str] | None, found: list,
                     skipped: list, budget: _Budget) -> None:
    """Take rows one at a time from the key the dispatcher ranks first, re-ranking
    it after each take. The ready list is ordered by the committed state; a key's
    score only grows within a transaction, so a key is opened only when its
    committed score could beat the best open one: O((n + opened) log keys)."""
    dispatch = env.dispatch
    dispatch.due(now_us)
    skip = {w.key_id(name, create=False) for name in exclude or ()}
    heap: list = []
    tiebreak = itertools.count()
    opened: set[int] = set()

    def open_key(kid: int) -> None:
        opened.add(kid)
        if kid not in skip:
            key_rows = _KeyRows(w, env, sq, kid, now_us, max_receives, skipped, budget)
            push(kid, key_rows, key_rows.next())

    def push(kid: int, key_rows: "_KeyRows", row) -> None:
        if row is not None:
            _, _, field, seq = layout.parse_row_key(row[0])
            score = dispatch.score(sq, kid, (layout.visible_since(field, now_us), seq),
                                   w.taken(sq, kid) + key_rows.taken)
            heapq.heappush(heap, (score, next(tiebreak), kid, key_rows, row))

    for kid in w.keys_joined(sq):  # given rows in this transaction: maybe not ranked yet
        open_key(kid)
    ranked = (entry for entry in dispatch.ready(sq) if entry[1] not in opened)
    waiting = next(ranked, None)
    while len(found) < n and budget.left > 0:
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
    into ``skipped`` (they count against the receive's scan budget). A key of an
    ordered subqueue with a row in flight has none: its rows go one batch at a time."""

    __slots__ = ("w", "cache", "rows", "now_us", "max_receives", "skipped", "taken", "budget")

    def __init__(self, w: Ledger, env: Env, sq: int, kid: int, now_us: int,
                 max_receives: int | None, skipped: list, budget: _Budget):
        self.w, self.cache, self.now_us, self.max_receives = w, env.cache, now_us, max_receives
        # keys only: a cached row's value comes from memory (docs/shards-and-storage.md),
        # others one get each
        self.rows = w.txn.scan_keys("rows", *layout.key_range(sq, kid))
        if sq in w.index.ordered and locked_until(w.txn, sq, kid, now_us) is not None:
            self.rows = iter(())
        self.skipped, self.taken, self.budget = skipped, 0, budget

    def next(self) -> tuple[bytes, bytes] | None:
        w, cache, budget = self.w, self.cache, self.budget
        txn, stats = w.txn, w.stats
        for row_key in self.rows:
            if layout.parse_row_key(row_key)[2] > self.now_us:
                break  # hidden and delayed rows sort after every visible one
            stats["rows_scanned"] += 1
            value = cache.get(row_key) or txn.get("rows", row_key)
            if layout.expires_us(value) <= self.now_us:
                self.skipped.append(Skipped(row_key, value, Skip.EXPIRED))
            elif layout.flags_of(value) & layout.CANCELLING:
                self.skipped.append(Skipped(row_key, value, Skip.CANCELLED))
            elif self.max_receives is not None and \
                    layout.dequeue_count(value) >= self.max_receives:
                self.skipped.append(Skipped(row_key, value, Skip.DEAD))
            else:
                return row_key, value
            budget.left -= 1
            if budget.left <= 0:
                break
        self.rows = iter(())
        return None
