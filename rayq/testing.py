"""Fakes that ship with rayq: an in-memory store, a fake clock, simulated consumers.

``memory_store()`` builds a :class:`~rayq.core.storage.store.ShardStore` over
:class:`MemoryKV`, an ordered in-memory key-value store with the transaction
semantics of LMDB (abort undoes everything, nested transactions), so the same
queue logic runs without disk and the same contract tests run against both.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import heapq
import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from rayq.config import Config, ConsumerConfig, StoreConfig
from rayq.core.consumers.balancer import BalancerState
from rayq.core.consumers.state import ConsumerState
from rayq.core.storage.cache import MemoryReading
from rayq.core.kit.clock import FakeClock
from rayq.core.kit.kv import (DATABASES, OnCommit, Write, apply_writes, move_rows,
                              recorded_moves)
from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.storage.store import ShardStore

T = TypeVar("T")
_MISSING = object()

__all__ = ["FakeClock", "MemoryKV", "SimulatedConsumers", "SimulatedLongPolls", "memory_store",
           "plenty_of_memory"]


class _Table:
    def __init__(self):
        self.keys: list[bytes] = []
        self.values: dict[bytes, bytes] = {}


class _MemoryTxn:
    """Writes apply at once; an undo log restores them if the transaction aborts.
    ``writes`` (a list when recording, else None) lists the mutations, as LMDB's does."""

    def __init__(self, tables: dict[str, _Table], write: bool, record: bool = False):
        self._tables, self._write = tables, write
        self.undo: list[tuple[str, bytes, object]] = []
        self.writes: list[Write] | None = [] if record else None

    def get(self, db, key):
        return self._tables[db].values.get(bytes(key))

    def put(self, db, key, value):
        self._need_write()
        table, key = self._tables[db], bytes(key)
        old = table.values.get(key, _MISSING)
        if old is _MISSING:
            bisect.insort(table.keys, key)
        table.values[key] = bytes(value)
        self.undo.append((db, key, old))
        if self.writes is not None:
            self.writes.append(Write(db, key, bytes(value)))

    def delete(self, db, key):
        self._need_write()
        table, key = self._tables[db], bytes(key)
        old = table.values.pop(key, _MISSING)
        if old is _MISSING:
            return False
        del table.keys[bisect.bisect_left(table.keys, key)]
        self.undo.append((db, key, old))
        if self.writes is not None:
            self.writes.append(Write(db, key, None))
        return True

    def putmulti(self, db, items):
        for key, value in items:
            self.put(db, key, value)

    def move_many(self, db, moves, kept_from):
        writes, self.writes = self.writes, None  # recorded as the moves, not their parts
        try:
            move_rows(self, db, moves)
        finally:
            self.writes = writes
        if writes is not None:
            writes.extend(recorded_moves(db, moves, kept_from))

    def scan_keys(self, db, start, stop=None):
        for key, _ in self.scan(db, start, stop):
            yield key

    def scan(self, db, start, stop=None):
        table = self._tables[db]
        i = bisect.bisect_left(table.keys, start)
        while i < len(table.keys):
            key = table.keys[i]
            if stop is not None and key >= stop:
                return
            yield key, table.values[key]
            i += 1

    @contextlib.contextmanager
    def nested(self):
        mark = len(self.undo)
        written = len(self.writes) if self.writes is not None else 0
        try:
            yield self
        except BaseException:
            self.rollback(mark)
            if self.writes is not None:
                del self.writes[written:]
            raise

    def rollback(self, mark: int = 0) -> None:
        while len(self.undo) > mark:
            db, key, old = self.undo.pop()
            table = self._tables[db]
            if key in table.values:
                del table.keys[bisect.bisect_left(table.keys, key)]
                del table.values[key]
            if old is not _MISSING:
                bisect.insort(table.keys, key)
                table.values[key] = old

    def _need_write(self):
        if not self._write:
            raise RuntimeError("write in a read transaction")


class MemoryKV:
    """An ordered in-memory key-value store with LMDB's transaction semantics, and its
    write sets (see :mod:`rayq.core.kit.kv`) when opened with ``on_commit``."""

    def __init__(self, on_commit: OnCommit | None = None):
        self._tables = {name: _Table() for name in DATABASES}
        self._on_commit = on_commit

    def watch(self, on_commit: OnCommit | None) -> None:
        """From now on hand each committed write set to ``on_commit`` (None: stop)."""
        self._on_commit = on_commit

    def transact(self, fn: Callable[..., T]) -> T:
        on_commit = self._on_commit
        txn = _MemoryTxn(self._tables, write=True, record=on_commit is not None)
        try:
            result = fn(txn)
        except BaseException:
            txn.rollback()
            raise
        if txn.writes:
            on_commit(tuple(txn.writes))
        return result

    def apply(self, writes: Iterable[Write]) -> None:
        """Replay a write set in one transaction."""
        self.transact(lambda txn: apply_writes(txn, writes))

    def read(self, fn: Callable[..., T]) -> T:
        return fn(_MemoryTxn(self._tables, write=False))

    def info(self) -> dict[str, int]:
        used = sum(len(k) + len(v) for t in self._tables.values() for k, v in t.values.items())
        return {"map_size_bytes": used, "used_bytes": used}

    def close(self) -> None:
        pass


def plenty_of_memory() -> MemoryReading:
    """A memory probe that never reports pressure (tests set pressure explicitly)."""
    return MemoryReading(process_rss_bytes=0, available_bytes=1 << 50)


def memory_store(config: StoreConfig = StoreConfig(), clock: FakeClock | None = None,
                 memory_probe=plenty_of_memory,
                 dispatch: DispatchPolicy = DispatchPolicy()) -> ShardStore:
    """A shard store held in memory, on a :class:`FakeClock` unless told otherwise."""
    return ShardStore(MemoryKV(), config=config, clock=clock or FakeClock(),
                      memory_probe=memory_probe, dispatch=dispatch)


@dataclass
class SimulatedConsumers:
    """Consumers sharing one queue, each balancing its load by hit rate, in discrete ticks.

    Each tick ``arrivals`` messages join the queue, every consumer polls once
    per unit of load (polls are served in random order, as a shard serves
    competing receives), and each consumer then adjusts its load. No clock,
    no threads: the balancer's behaviour alone.
    """

    config: ConsumerConfig
    seed: int = 0
    depth: int = 0
    states: list[BalancerState] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    empty_polls: int = 0

    def __post_init__(self):
        self._rng = random.Random(self.seed)

    def join(self) -> int:
        """Add a consumer at its initial load; returns its index."""
        self.states.append(BalancerState.initial(self.config))
        self.received.append(0)
        return len(self.states) - 1

    def tick(self, arrivals: int) -> list[int]:
        """Run one period; returns what each consumer received in it."""
        self.depth += arrivals
        polls = [i for i, s in enumerate(self.states) for _ in range(s.load)]
        self._rng.shuffle(polls)
        got = [0] * len(self.states)
        for i in polls:
            hit = self.depth > 0
            if hit:
                self.depth -= 1
                got[i] += 1
            else:
                self.empty_polls += 1
            self.states[i] = self.states[i].polled(hit)
        self.states = [s.adjusted(self.config) for s in self.states]
        for i, n in enumerate(got):
            self.received[i] += n
        return got

    def run(self, ticks: int, arrivals: int) -> list[int]:
        """Run ``ticks`` periods; returns what each consumer received over them."""
        totals = [0] * len(self.states)
        for _ in range(ticks):
            for i, n in enumerate(self.tick(arrivals)):
                totals[i] += n
        return totals


class SimulatedLongPolls:
    """Consumers (each a :class:`~rayq.core.consumers.state.ConsumerState`)
    long-polling one queue on a fake clock, event by event.

    Tasks arrive at random (a Poisson stream of ``rate_per_s``) and each runs
    ``task_s``. A poller takes what is queued at once, or parks until a task
    arrives (parked polls are served oldest first, as a shard serves them) or
    until ``poll_wait_s`` passes; the state decides whether an answer that came
    after a wait was a hit (``hit_wait_s``). A poller runs what it got and polls
    again. Every ``adjust_interval_s`` each consumer moves its load and starts
    pollers for it; a poller above the load leaves. No threads, no sleeps.
    """

    def __init__(self, config: ConsumerConfig, consumers: int, rate_per_s: float,
                 task_s: float, seed: int = 0):
        self.clock, self.task_s, self.rate_per_s = FakeClock(start=0.0), task_s, rate_per_s
        self.states = [ConsumerState(i, Config(consumers=config), self.clock)
                       for i in range(consumers)]
        self.queued = 0
        self.loads: list[list[int]] = [[] for _ in self.states]  # after every adjust
        self._rng = random.Random(seed)
        self._events: list[tuple[float, int, str, tuple]] = []
        self._tokens = itertools.count()
        self._parked: collections.deque = collections.deque()  # (token, consumer, slot, since, want)
        self._waiting: set[int] = set()   # tokens of parked polls not answered yet
        self._busy: dict[tuple[int, int], int] = {}   # (consumer, slot) -> tasks running
        self._pollers: list[set[int]] = [set() for _ in self.states]
        self._at(self._rng.expovariate(rate_per_s), "arrive")
        for i in range(consumers):
            self._at(0.0, "adjust", i)

    def run(self, seconds: float) -> None:
        """Simulate ``seconds`` more of the fake clock."""
        end = self.clock.now() + seconds
        while self._events and self._events[0][0] <= end:
            at, _, kind, args = heapq.heappop(self._events)
            self.clock.advance(at - self.clock.now())
            getattr(self, "_" + kind)(*args)
        self.clock.advance(end - self.clock.now())

    def mean_loads(self, last: int) -> list[float]:
        """Each consumer's mean load over its ``last`` adjustments."""
        return [sum(loads[-last:]) / len(loads[-last:]) for loads in self.loads]

    # -- events --------------------------------------------------------------------
    def _at(self, delay_s: float, kind: str, *args) -> None:
        heapq.heappush(self._events, (self.clock.now() + delay_s, next(self._tokens), kind, args))

    def _arrive(self) -> None:
        self._at(self._rng.expovariate(self.rate_per_s), "arrive")
        while self._parked:
            token, i, slot, since, want = self._parked.popleft()
            if token in self._waiting:
                self._waiting.discard(token)
                self._got(i, slot, want, 1, self.clock.now() - since)
                return
        self.queued += 1

    def _adjust(self, i: int) -> None:
        for slot in self.states[i].adjust(False, self._pollers[i]):
            self._pollers[i].add(slot)
            self._poll(i, slot)
        self.loads[i].append(self.states[i].load)
        self._at(self.states[i].consumer_config.adjust_interval_s, "adjust", i)

    def _poll(self, i: int, slot: int) -> None:
        state = self.states[i]
        if slot >= state.load:
            self._pollers[i].discard(slot)  # the load dropped below this poller
            return
        want = state.claim()
        if not want:
            self._at(self.task_s, "poll", i, slot)  # no room: look again once tasks end
        elif self.queued:
            got = min(want, self.queued)
            self.queued -= got
            self._got(i, slot, want, got, 0.0)
        else:
            token = next(self._tokens)
            self._waiting.add(token)
            self._parked.append((token, i, slot, self.clock.now(), want))
            self._at(state.consumer_config.poll_wait_s, "expire", token, i, slot, want)

    def _expire(self, token: int, i: int, slot: int, want: int) -> None:
        if token in self._waiting:  # nothing came: an empty long poll
            self._waiting.discard(token)
            self._got(i, slot, want, 0, self.states[i].consumer_config.poll_wait_s)

    def _got(self, i: int, slot: int, want: int, got: int, waited_s: float) -> None:
        self.states[i].received(want, got, waited_s)
        if not got:
            self._poll(i, slot)
            return
        self._busy[(i, slot)] = got
        for _ in range(got):
            self._at(self.task_s, "done", i, slot, self.states[i].started())

    def _done(self, i: int, slot: int, started: float) -> None:
        state = self.states[i]
        state.finished(started)
        state.released()
        self._busy[(i, slot)] -= 1
        if not self._busy[(i, slot)]:
            self._poll(i, slot)
