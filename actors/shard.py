"""ShardActor: one LMDB shard behind an async Ray actor with group commit.

Concurrent calls queue up while a transaction commits; the next transaction
takes all of them at once (group commit: one fsync for many calls, with no
fixed delay). Every store access runs on one worker thread, so the event loop
keeps accepting calls while LMDB syncs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psutil
import ray

from actors.gate import Gate, manager_directory
from actors.metrics import BackgroundFailures, ShardMetrics
from rayq.analytics.eventlog import open_event_log
from rayq.config import Config
from rayq.core.auth import ADMIN, Signature, check_admin, check_senders
from rayq.core.model import Ending, Receipt, SubqueueState
from rayq.core.store import KeyDepth, StoreStats, open_store
from rayq.core.tasks import decode_outcome
from rayq.errors import (AuthError, InvalidMessage, Overloaded, RayqError, ReceiptInvalid,
                         StoreError, TaskError)

log = logging.getLogger("rayq.shard")
MAX_PENDING_CALLS = 10_000
EXPIRY_INTERVAL_S = 5.0
MAX_WAIT_SLICE_S = 1.0  # long polls re-check at least this often (messages whose visibility lapses)
OUTCOME_RECHECK_S = 30.0  # outcome waiters re-read the table this often, whatever they were told
# wait_outcome calls park until a task ends, possibly for hours: they get their own
# concurrency group (its own event loop and thread) so they never take the slots
# that puts, receives and deletes need.
OUTCOME_GROUP = "outcomes"
_END_CALLS = ("finish", "defer", "change_visibility")
CONCURRENCY_GROUPS = {OUTCOME_GROUP: 100_000}
_ENDINGS = {Ending.DEAD: ("DeadLettered", "the task was delivered max_receives times "
                                          "without finishing and is in the dead-letter queue"),
            Ending.EXPIRED: ("Expired", "the task's time to live ran out before it ran"),
            Ending.DELETED: ("Deleted", "the task was deleted or cleared before it finished")}


@dataclass(frozen=True)
class ShardStats:
    """A shard's store counters plus its group-commit and per-subqueue load counters."""

    index: int
    store: StoreStats
    commits: int
    calls_committed: int
    ops: dict[int, int]
    throttled: dict[int, int]
    background_failures: int = 0  # failed housekeeping rounds since the shard started


class ShardActor:
    def __init__(self, index: int, path: str, config: Config):
        self.index = index
        self.store = open_store(path, config=config.store)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"shard-{index}")
        self._loop = asyncio.get_running_loop()
        self._pending: list[tuple[str, tuple, dict, asyncio.Future]] = []
        self._committing = False
        self._arrivals: dict[int, asyncio.Event] = {}
        self._ops: Counter[int] = Counter()
        self._throttled: Counter[int] = Counter()
        self._commits = self._calls = 0
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}
        self._waiters_lock = threading.Lock()
        self._housekeeping = self._loop.create_task(self._collect_expired_forever())
        self.metrics = ShardMetrics(index)
        self.failures = BackgroundFailures("shard", index)
        # enqueues go to the event log, in batches
        self.events = open_event_log(os.path.dirname(path), f"shard-{index}", config.analytics,
                                     self._collect_events)
        self.store.keep_enqueued = self.events is not None
        self.gate = Gate(manager_directory)
        self.key_mode = config.fairness.key

    # -- group commit ------------------------------------------------------
    async def _write(self, subqueue: int | None, name: str, *args, **kwargs) -> Any:
        result = await self._enqueue(subqueue, name, *args, **kwargs)
        if isinstance(result, BaseException):
            raise result
        return result

    def _enqueue(self, subqueue: int | None, name: str, *args, **kwargs) -> asyncio.Future:
        """Queue one store call for the next group commit; its future holds the result
        or the RayqError it raised."""
        if len(self._pending) >= MAX_PENDING_CALLS:
            if subqueue is not None:
                self._throttled[subqueue] += 1
            raise Overloaded(f"shard {self.index} has {len(self._pending)} calls waiting")
        future = self._loop.create_future()
        self._pending.append((name, args, kwargs, future))
        if not self._committing:
            self._committing = True
            self._loop.create_task(self._commit_pending())
        return future

    async def _commit_pending(self) -> None:
        try:
            while self._pending:
                calls, self._pending = self._pending, []
                try:
                    results, finished = await self._loop.run_in_executor(
                        self._thread, self._group, [c[:3] for c in calls])
                    self._notify(finished)
                except RayqError as err:
                    results = [err] * len(calls)
                except Exception as err:  # the transaction failed as a whole: nothing committed
                    results = [StoreError(f"shard {self.index} transaction failed: {err!r}")] * len(calls)
                self._commits += 1
                self._calls += len(calls)
                for (name, args, _, future), result in zip(calls, results):
                    if name == "put" and not isinstance(result, BaseException):
                        self._wake(args[0])
                    if not future.done():
                        future.set_result(result)
        finally:
            self._committing = False

    def _group(self, calls: list) -> tuple[list, list]:
        return self.store.group(calls), self.store.take_finished()

    async def _read(self, fn, *args) -> Any:
        return await self._loop.run_in_executor(self._thread, fn, *args)

    def _wake(self, subqueue: int) -> None:
        event = self._arrivals.pop(subqueue, None)
        if event is not None:
            event.set()

    # -- queue operations ------------------------------------------------------
    async def put(self, subqueue: int, messages: list, auth: Signature | None = None) -> list[str]:
        account = await self.gate.allow(auth, "put", self.index, [subqueue], subqueue, messages)
        check_senders(account, messages, self.key_mode)
        ids = await self._write(subqueue, "put", subqueue, messages)
        self._ops[subqueue] += len(ids)
        return ids

    async def receive(self, subqueue: int, max_messages: int = 1,
                      visibility_timeout_s: float | None = None, *, keys=None,
                      max_receives: int | None = None, dead_letter: int | None = None,
                      wait_s: float = 0.0, exclude=None, auth: Signature | None = None) -> list:
        """Receive; with ``wait_s`` wait for arrivals (woken by puts, no spinning)."""
        await self.gate.allow(auth, "receive", self.index,
                              [subqueue] + ([dead_letter] if dead_letter is not None else []),
                              subqueue, max_messages, visibility_timeout_s, keys, max_receives,
                              dead_letter, wait_s, exclude)
        deadline = self._loop.time() + max(0.0, float(wait_s or 0.0))
        while True:
            got = await self._write(subqueue, "receive", subqueue, max_messages,
                                    visibility_timeout_s, keys=keys, exclude=exclude,
                                    max_receives=max_receives, dead_letter=dead_letter)
            remaining = deadline - self._loop.time()
            if got or remaining <= 0:
                self._ops[subqueue] += max(1, len(got))
                return got
            event = self._arrivals.setdefault(subqueue, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), min(remaining, MAX_WAIT_SLICE_S))
            except asyncio.TimeoutError:
                pass

    async def delete(self, receipts: list[str], auth: Signature | None = None) -> list[str]:
        await self.gate.allow(auth, "delete", self.index, _receipt_subqueues(receipts), receipts)
        return await self._write(None, "delete", receipts)

    async def change_visibility(self, receipt: str, timeout_s: float,
                                auth: Signature | None = None) -> str:
        await self.gate.allow(auth, "change_visibility", self.index,
                              _receipt_subqueues([receipt]), receipt, timeout_s)
        return await self._write(None, "change_visibility", receipt, timeout_s)

    async def defer(self, receipt: str, delay_s: float) -> str:
        return await self._write(None, "defer", receipt, delay_s)

    async def finish(self, receipt: str, outcome: bytes, dead_letter: int | None = None) -> None:
        """End a received task with its encoded outcome (see ShardStore.finish)."""
        return await self._write(None, "finish", receipt, outcome, dead_letter)

    async def end_many(self, calls: list[tuple[str, tuple]]) -> list:
        """Many ``finish``/``defer``/``change_visibility`` calls in one round trip (consumers
        batch the ends of their tasks); each result is the value or the RayqError raised."""
        if not isinstance(calls, list) or not all(
                isinstance(c, tuple) and len(c) == 2 and c[0] in _END_CALLS for c in calls):
            raise InvalidMessage(f"end_many takes a list of (name, args), name in {_END_CALLS}")
        futures = [self._enqueue(None, name, *args) for name, args in calls]
        return list(await asyncio.gather(*futures))

    # -- task outcomes -------------------------------------------------------------
    @ray.method(concurrency_group=OUTCOME_GROUP)
    async def wait_outcome(self, message_id: str) -> Any:
        """Wait until a task message ends; return its handler's value or raise TaskError.

        ``client.submit`` hands this call's ObjectRef to the user. It runs in its
        own concurrency group, and a shard restart re-runs it against the
        durable outcomes table, so the ref resolves exactly once.
        """
        loop = asyncio.get_running_loop()
        found = None
        while found is None:
            future = loop.create_future()
            with self._waiters_lock:  # register before reading: no wake-up is missed
                self._waiters.setdefault(message_id, []).append((loop, future))
            try:
                found = await loop.run_in_executor(self._thread, self.store.outcome, message_id)
                if found is None:
                    await asyncio.wait([future], timeout=OUTCOME_RECHECK_S)
                    found = future.result() if future.done() else None
            finally:
                self._forget(message_id, future)
        ending, payload = found
        if ending is Ending.RESULT:
            return decode_outcome(payload)
        raise TaskError(*_ENDINGS[ending])

    def _notify(self, finished: list[tuple[str, Ending, bytes]]) -> None:
        """Hand each recorded outcome to the calls waiting for it (on their own loop)."""
        for message_id, ending, payload in finished:
            with self._waiters_lock:
                waiters = self._waiters.pop(message_id, [])
            for loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, (ending, payload))

    def _forget(self, message_id: str, future: asyncio.Future) -> None:
        with self._waiters_lock:
            waiters = self._waiters.get(message_id)
            if waiters is None:
                return
            waiters[:] = [w for w in waiters if w[1] is not future]
            if not waiters:
                del self._waiters[message_id]

    async def clear(self, subqueue: int, auth: Signature | None = None) -> int:
        await self.gate.allow(auth, "clear", self.index, [subqueue], subqueue)
        return await self._write(subqueue, "clear", subqueue)

    async def peek(self, subqueue: int, max_messages: int = 1, *, keys=None,
                   auth: Signature | None = None) -> list:
        await self.gate.allow(auth, "peek", self.index, [subqueue], subqueue, max_messages, keys)
        return await self._read(lambda: self.store.peek(subqueue, max_messages, keys=keys))

    async def counts(self, subqueues: list[int], auth: Signature | None = None) -> dict[int, int]:
        await self.gate.allow(auth, "counts", self.index, _listed(subqueues), subqueues)
        return await self._read(lambda: {sq: self.store.count(sq) for sq in subqueues})

    async def forget_keys(self) -> None:
        """Account keys changed: verify the next signed request with a fresh copy."""
        self.gate.forget()

    async def set_state(self, subqueue: int, state: str) -> None:
        await self._read(self.store.set_state, subqueue, SubqueueState(state))

    # -- flooders ------------------------------------------------------------------
    async def set_diverts(self, diverts: dict) -> None:
        """Flooders whose new messages to a subqueue go to the spill store."""
        await self._read(self.store.set_diverts, diverts)

    async def sweep(self, type_: str, tenant: str, target: int, limit: int) -> int:
        return await self._write(target, "sweep", type_, tenant, target, limit)

    async def move_matching(self, source: int, target: int, type_: str, tenant: str,
                            limit: int, after: bytes | None = None) -> tuple:
        return await self._write(source, "move_matching", source, target, type_, tenant,
                                 limit, after)

    async def health(self) -> tuple[int, bool]:
        """(messages stored, under memory pressure): what the sweeper checks per batch."""
        stats = await self._read(self.store.stats)
        return stats.messages, stats.cache.under_pressure

    async def flood_snapshot(self) -> dict:
        """What the flood detector needs: counts per (kind, subqueue, type, tenant),
        enqueues per window, the shard's depth and whether it is under memory pressure."""
        def read():
            stats = self.store.stats()
            return {"tenant_counts": self.store.tenant_counts(),
                    "enqueues": self.store.enqueue_counts(), "depth": stats.messages,
                    "under_pressure": stats.cache.under_pressure}
        return await self._read(read)

    async def depths(self, subqueues: list[int] | None = None,
                     auth: Signature | None = None) -> list[KeyDepth]:
        """Depth and oldest age per (subqueue, key); only of ``subqueues`` if given (an
        account other than the admin must name its own)."""
        account = await self.gate.allow(auth, "depths", self.index, _listed(subqueues or []),
                                        subqueues)
        if subqueues is None and account != ADMIN:
            raise AuthError("an account reads the depths of its own subqueues only")
        depths = await self._read(self.store.depths)
        if subqueues is None:
            return depths
        wanted = set(subqueues)
        return [d for d in depths if d.subqueue in wanted]

    async def enqueue_counts(self) -> dict:
        return await self._read(self.store.enqueue_counts)

    async def stats(self, auth: Signature | None = None) -> ShardStats:
        check_admin(await self.gate.account(auth, "", "stats"), "shard statistics")
        store_stats = await self._read(self.store.stats)
        return ShardStats(self.index, store_stats, self._commits, self._calls,
                          dict(self._ops), dict(self._throttled), self.failures.total)

    async def process(self) -> dict:
        """The shard process's pid and memory: resident in all, and private (anonymous)
        memory without the LMDB file pages the kernel maps in and can drop at will."""
        info = psutil.Process().memory_info()  # on Linux `shared` is RssFile + RssShmem
        return {"pid": os.getpid(), "rss_bytes": info.rss, "private_bytes": info.rss - info.shared}

    async def _collect_events(self) -> None:
        for at, sq, type_, tenant, message_id, key in await self._read(self.store.take_enqueued):
            self.events.append("enqueue", at, subqueue=sq, type=type_, tenant=tenant,
                               message_id=message_id, key=key)

    async def flush_events(self, auth: Signature | None = None) -> int:
        """Write buffered events now (``client.report`` does this first)."""
        await self.gate.admin(auth, "flush_events")
        if self.events is None:
            return 0
        await self._collect_events()
        return await asyncio.to_thread(self.events.flush)

    async def ping(self) -> int:
        return self.index

    async def _collect_expired_forever(self) -> None:
        """Housekeeping: collect expired messages, then refresh the metrics."""
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL_S)
            try:
                await self._write(None, "collect_expired", 10_000)
                stats, depths = await self._read(lambda: (self.store.stats(), self.store.depths()))
                self.metrics.update(stats, depths)
            except RayqError as err:  # overloaded: try again next round
                self.failures.record("housekeeping", err)
            except Exception:  # metrics must never stop housekeeping
                log.exception("shard %d housekeeping failed", self.index)


def _listed(subqueues: Any) -> list:
    return list(subqueues) if isinstance(subqueues, (list, tuple)) else [None]


def _receipt_subqueues(receipts: Any) -> list:
    """The subqueues receipts point into; malformed ones are left to the store to refuse."""
    out = []
    for receipt in _listed(receipts):
        try:
            out.append(Receipt.decode(receipt).subqueue)
        except ReceiptInvalid:
            pass
    return out


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
