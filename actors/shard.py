"""ShardActor: one LMDB shard behind an async Ray actor with group commit.

Concurrent calls queue up while a transaction commits; the next transaction
takes all of them at once (group commit: one fsync for many calls, with no
fixed delay). Every store access runs on one worker thread, so the event loop
keeps accepting calls while LMDB syncs.

A signed request's nonce is written in the same transaction as the request it
signs, so a request captured before a restart is still refused after it. A
signed read (peek, counts, depths, stats) waits for its nonce's group commit
before it answers: a replayed read would show the replayer the queue as it is now.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psutil
import ray

from actors.channel import ChannelServer
from actors.base import LIVENESS_GROUPS, GatedActor, manager_directory
from rayq.core.auth import nonces
from actors.outcomes import DeskTeller
from actors.metrics import ShardMetrics, trim_heap
from actors.parking import ParkedPolls
from actors.data_nodes import this_node_name
from actors.replication.leader import replication_of
from actors.storethread import StoreThread
from rayq.analytics.eventlog import open_event_log
from rayq.batching import AsyncBatcher
from rayq.channel import CHANNEL_METHODS, host_id
from rayq.handoff import Host
from rayq.config import Config, shard_store_config
from rayq.core.auth.accounts import ADMIN, Signature, check_senders
from rayq.core.auth.operations import SHARD_OPS
from rayq.core.kit.batcher import Batcher
from rayq.core.kit.clock import Clock
from rayq.core.storage.dispatch import DispatchPolicy, NoisyKey
from rayq.core.codec.task_ids import check_task_id
from rayq.core.storage.outcomes import CancelResult
from rayq.core.storage.writes import (Cancel, ChangeVisibility, Clear, CollectExpired, Defer,
                                      Delete, Finish, MoveMatching, Put, Receive, Redrive, Sweep,
                                      TakeUsage, Write, decode_ends, small_group)
from rayq.core.auth.gate import (Caller, Gate, check_reads_own, check_redrive, of_subqueues,
                                 per_queue, queues_on, signed)
from rayq.core.codec.wire import delivered_count, join_delivered
from rayq.core.flood.isolation import serving_order
from rayq.core.codec.model import KeyDepth, SubqueueState, long_poll_s
from rayq.core.replication.shard_places import role_of
from rayq.core.replication.shipping import value_of
from rayq.core.storage.store import StoreStats, open_store
from rayq.core.storage.spill import FlooderPuts
from rayq.errors import Overloaded, QueueDisabled, RayqError, StoreError

log = logging.getLogger("rayq.shard")
MAX_PENDING_CALLS = 10_000
EXPIRY_INTERVAL_S = 5.0
REVIEW_INTERVAL_S = 1.0  # how often fair dispatch re-marks noisy keys (O(keys) each time)
PURGE_ROWS = 2_000     # rows (and spill entries) per background removal transaction
PURGE_PAUSE_S = 0.01   # between two of them: calls waiting for the store go first
MAX_WAIT_SLICE_S = 1.0  # long polls re-check at least this often (messages whose visibility lapses)
TOLD_WAIT_S = 10.0  # how long a redrive waits for its desk to hear of it
# The outcome desks' reads of task ends get their own concurrency group (its own event
# loop and thread): they never wait behind puts, receives and deletes.
OUTCOME_GROUP = "outcomes"
CONCURRENCY_GROUPS = {OUTCOME_GROUP: 100_000, **LIVENESS_GROUPS}


@dataclass(frozen=True)
class ShardStats:
    """A shard's store counters plus its group-commit and per-subqueue load counters.
    ``queues``: messages on this shard per queue, every account's, by unambiguous name
    (``acme/orders``; the default account's plain)."""

    index: int
    store: StoreStats
    commits: int
    calls_committed: int
    ops: dict[int, int]        # requests served per subqueue: puts, and receives trying it
    throttled: dict[int, int]  # calls per subqueue refused with Overloaded
    queues: dict[str, int] = field(default_factory=dict)
    background_failures: int = 0  # failed housekeeping rounds since the shard started
    node: str = ""  # the data node it runs on ("": the embedded runtime's only node)
    role: str = "leader"


class _Entry(NamedTuple):
    """One entry of a group commit: a write with the nonce of the request that signed
    it (None: unsigned), or a signed read's nonce alone (no write)."""

    op: Write | None
    nonce: bytes | None


class ShardActor(GatedActor):
    def __init__(self, index: int, path: str, config: Config, clock: Clock | None = None):
        super().__init__("shard", clock, index)
        self.node = this_node_name()
        self.store = open_store(path, config=shard_store_config(config), clock=self.clock,
                                dispatch=DispatchPolicy.of(config.fairness),
                                check_senders=check_senders)
        self._store = StoreThread(f"shard-{index}")
        self._loop = asyncio.get_running_loop()
        # group commit of writes, each with the nonce of the request it serves (_Entry)
        commits = Batcher(max_pending=MAX_PENDING_CALLS, name=f"shard {index}")
        self._group_commit = AsyncBatcher(commits, self._commit)
        # parked long polls per subqueue, oldest first: a put of n messages wakes n of them
        self._parked = ParkedPolls()
        # requests per subqueue (a put, or a receive trying it: a batch is one), which
        # subqueue scaling reads (docs/autoscaling.md)
        self._ops: Counter[int] = Counter()
        self._throttled: Counter[int] = Counter()
        self._commits = self._calls = 0
        self._desk = DeskTeller(index, self.clock)  # where the refs of submits wait (actors/outcomes.py)
        self.metrics = ShardMetrics(index)
        self._channel = ChannelServer(
            self, CHANNEL_METHODS, f"shard-{index}", path,
            ray.util.get_node_ip_address if config.store.remote_channel else None)
        self._handed = Host()  # the connections handed to this shard (door)
        self._run_every(EXPIRY_INTERVAL_S, "housekeeping", self._collect_expired)
        self._run_every(REVIEW_INTERVAL_S, "dispatch review", self._review_dispatch)
        self._run_paced("background removal", self._purge_some, self._purge_pause_s)
        # enqueues go to the event log, in batches
        self.events = open_event_log(os.path.dirname(path), f"shard-{index}", config.analytics,
                                     self._collect_events)
        self.store.keep_enqueued = self.events.enabled
        self.gate = Gate(manager_directory, seen=nonces.load(self.store.kv, self.clock.now()),
                         clock=self.clock, shard=index)
        self.key_mode = config.fairness.key
        self._dedicated: frozenset[int] = frozenset()  # flooders' subqueues here (set_diverts)
        self._dedicated_turns, self._dedicated_every = 0, config.flood.dedicated_turn_every
        self.store.set_flooder_puts(FlooderPuts.of(config.flood))  # spill, throttle or block
        # replication (docs/replication.md); with one copy nothing is recorded
        self.replication = replication_of(self.index, path, self.store.kv, config, self.clock)
        self.shipper = self.replication.shipper

    async def seed(self, node: str) -> int:
        """Seed a follower on ``node`` (the manager started it there); see
        :meth:`actors.replication.leader.Replication.seed`."""
        return await self.replication.seed(node, self._read)

    # -- group commit ------------------------------------------------------
    async def _write(self, op: Write | None, signed: Signature | None = None) -> Any:
        """Make write ``op`` in the next group commit, with the nonce of the request that
        ``signed`` it (None: unsigned, or a later round of a long poll); no ``op``: the
        nonce alone."""
        self.shipper.check()  # refused before it is stored: too few copies in sync
        result = await self.shipper.acked(self._enqueue(op, signed))
        if isinstance(result, BaseException):
            raise result
        return result

    async def _remember(self, signed: Signature | None) -> None:
        """Make a signed read's nonce durable (the next group commit) before it answers."""
        if signed is not None:
            await self._write(None, signed)

    def _enqueue(self, op: Write | None, signed: Signature | None = None) -> asyncio.Future:
        """Queue one write (or a nonce alone) for the next group commit; its future holds
        the result or the RayqError it raised. Raises Overloaded when MAX_PENDING_CALLS
        wait (counted as throttled on the subqueue the write loads)."""
        nonce = nonces.nonce_key(signed) if signed is not None else None
        try:
            return self._group_commit.submit(_Entry(op, nonce))
        except Overloaded:
            subqueue = op.loads() if op is not None else None
            if subqueue is not None:
                self._throttled[subqueue] += 1
            raise

    async def _commit(self, entries: list[_Entry]) -> list:
        """One group commit of ``entries``: a result per entry, the value or the RayqError
        it raised (a failed transaction fails every entry: nothing of it was committed).
        Wakes the polls parked on the subqueues the writes filled."""
        try:
            results, finished, shipment = await self._store.run(
                self._group, entries, inline=small_group([e.op for e in entries]))
            self._desk.tell(finished)
            results = self.shipper.ship(results, shipment)  # acked once followers applied it
        except RayqError as err:
            results = [err] * len(entries)
        except Exception as err:
            failed = StoreError(f"shard {self.index} transaction failed: {err!r}")
            results = [failed] * len(entries)
        self._commits += 1
        self._calls += len(entries)
        for entry, result in zip(entries, results):
            value = value_of(result)
            if entry.op is not None and not isinstance(value, BaseException):
                for subqueue, polls in entry.op.wakes(value):
                    self._parked.wake(subqueue, polls)
        return results

    def _group(self, entries: list[_Entry]) -> tuple[list, list, tuple | None]:
        """One transaction: the writes, the nonces of the requests they serve, and
        (replicating) the group's sequence number; its write set to ship, if any."""
        keys = [e.nonce for e in entries if e.nonce is not None]

        def also(txn) -> None:
            if keys:
                nonces.remember(txn, keys, self.clock.now())
            self.replication.stamp(txn)
        done = iter(self.store.group([e.op for e in entries if e.op is not None], also))
        results = [next(done) if e.op is not None else None for e in entries]
        shipment = self.replication.take()
        return results, self.store.take_finished(), shipment

    async def _read(self, fn, *args) -> Any:
        return await self._store.run(fn, *args)

    async def _park(self, subqueues: list[int], timeout_s: float) -> None:
        """Wait until a put to one of ``subqueues`` wakes this poll, a hidden or delayed
        message of theirs becomes visible, or ``timeout_s`` passes."""
        due = self.store.dispatch.next_due(subqueues)
        if due is not None:
            timeout_s = min(timeout_s, max(0.0, due - self.clock.now()))
        await self._parked.park(subqueues, timeout_s)

    # -- queue operations ------------------------------------------------------
    @signed(SHARD_OPS["put"])
    async def put(self, subqueue: int, batch: bytes, *, caller: Caller) -> list[str]:
        """Store a put buffer (:mod:`rayq.core.codec.wire`) durably; the ids in order."""
        account = caller.account
        sender = None if account == ADMIN else (account, self.key_mode,
                                                self.gate.task_types(account, subqueue),
                                                self.gate.owns_plain(account, subqueue))
        ids = await self._write(Put(subqueue, batch, sender, account), caller.auth)
        self._ops[subqueue] += 1
        return ids

    @signed(SHARD_OPS["receive"])
    async def receive(self, subqueue: int | list[int], max_messages: int = 1,
                      visibility_timeout_s: float | None = None, *, keys=None,
                      max_receives: int | None = None, dead_letter: int | None = None,
                      wait_s: float = 0.0, exclude=None, caller: Caller) -> bytes:
        """Receive from one subqueue, or from several (this shard's subqueues of one
        queue, in receive order), going on through them until it has ``max_messages``
        or has tried them all. With ``wait_s`` the call parks until a put wakes it: one
        parked call, however many subqueues.
        The answer is one buffer (:func:`rayq.core.codec.wire.decode_delivered` reads it)."""
        subqueues = self._serving_order(subqueue if isinstance(subqueue, list) else [subqueue])
        deadline = self._loop.time() + long_poll_s(wait_s)
        signed = caller.auth  # its nonce goes with the first round
        while True:
            parts, count, refused = [], 0, None
            for sq in subqueues:  # on until it has max_messages or has tried them all
                try:
                    got = await self._write(Receive(
                        sq, max_messages - count, visibility_timeout_s, keys=keys,
                        exclude=exclude, max_receives=max_receives, dead_letter=dead_letter),
                        signed)
                except QueueDisabled as err:  # dropped since the caller routed: the others
                    refused = err             # still serve; raised if none had anything
                    continue
                finally:
                    signed = None
                found = delivered_count(got)
                self._ops[sq] += 1
                if found or not parts:
                    parts.append(got)
                count += found
                if count >= max_messages:
                    break
            if refused is not None and not count:
                raise refused
            remaining = deadline - self._loop.time()
            if count or remaining <= 0:
                return join_delivered(parts)
            await self._park(subqueues, min(remaining, MAX_WAIT_SLICE_S))

    def _serving_order(self, subqueues: list[int]) -> list[int]:
        """The order this receive tries ``subqueues`` in: theirs, but on every
        ``FloodConfig.dedicated_turn_every``-th receive that finds a flooder's dedicated
        subqueue behind live ones, that one first (docs/flood-detection.md)."""
        if len(subqueues) < 2 or self._dedicated.isdisjoint(subqueues):
            return subqueues
        self._dedicated_turns += 1
        return serving_order(subqueues, self._dedicated, self._dedicated_turns,
                             self._dedicated_every)

    @signed(SHARD_OPS["delete"])
    async def delete(self, receipts: list[str], *, caller: Caller) -> list[str]:
        return await self._write(Delete(receipts), caller.auth)

    @signed(SHARD_OPS["change_visibility"])
    async def change_visibility(self, receipt: str, timeout_s: float, *, caller: Caller) -> str:
        return await self._write(ChangeVisibility(receipt, timeout_s), caller.auth)

    async def defer(self, receipt: str, delay_s: float) -> str:
        return await self._write(Defer(receipt, delay_s))

    async def finish(self, receipt: str, outcome: bytes, dead_letter: int | None = None) -> None:
        """End a received task with its encoded outcome (see rayq.core.storage.writes.Finish)."""
        return await self._write(Finish(receipt, outcome, dead_letter))

    @signed(SHARD_OPS["end_many"])
    async def end_many(self, calls: list[tuple[str, tuple]], *, caller: Caller) -> list:
        """Many ends of deliveries in one round trip (consumers batch the ends of their
        tasks; signed, only the admin's), in the compact form
        :func:`rayq.core.storage.writes.decode_ends` reads (InvalidMessage refuses a
        malformed batch whole); each result is the value or the RayqError raised."""
        self.shipper.check()
        futures = [self._enqueue(end) for end in decode_ends(calls)]
        return list(await asyncio.gather(*(self.shipper.acked(f) for f in futures)))

    # -- task outcomes and tasks by id ---------------------------------------------
    @ray.method(concurrency_group=OUTCOME_GROUP)
    async def task_ends(self, message_ids: list[str]) -> list:
        """How each task ended, None while it has not, False when this shard keeps no
        copy of it (the outcome desks' reads: see ShardStore.task_ends)."""
        return await self._read(self.store.task_ends, message_ids)

    async def take_usage(self, limit: int) -> list[bytes]:
        """Remove and return up to ``limit`` usage reports of ended deliveries (the fairness
        coordinator takes them: see rayq.core.storage.writes.TakeUsage). Looked for first
        with a read: taking is a group commit (fsync'd, and shipped to followers), which an
        idle shard would otherwise make on every coordinator round for nothing."""
        if not await self._read(self.store.usage_waiting):
            return []
        return await self._write(TakeUsage(limit))

    @signed(SHARD_OPS["tasks"])
    async def tasks(self, task_ids: list[str], *, caller: Caller) -> list:
        """The caller's account's tasks submitted under ``task_ids`` (ShardStore.tasks)."""
        await self._remember(caller.auth)
        return await self._read(self.store.tasks, caller.account, task_ids)

    @signed(SHARD_OPS["redrive"])
    async def redrive(self, source: int, target: int, limit: int, *, type_: str | None = None,
                      until_us: int | None = None, after: bytes | None = None,
                      caller: Caller) -> tuple:
        """Move dead letters of ``source`` (the DLQ subqueue here of ``target``'s queue)
        back into ``target``: see rayq.core.storage.writes.Redrive. Answers once this
        shard's outcome desk heard the redriven tasks' old ends forgotten (at most
        TOLD_WAIT_S: a desk restarting has none kept)."""
        check_redrive(await self.gate.known([source, target]), source, target, self.index)
        result = await self._write(Redrive(source, target, limit, type_, until_us, after),
                                   caller.auth)
        try:
            await asyncio.wait_for(self._desk.told(), TOLD_WAIT_S)
        except asyncio.TimeoutError:
            pass
        return result

    @signed(SHARD_OPS["cancel"])
    async def cancel(self, task_id: str, *, caller: Caller) -> CancelResult | None:
        """Cancel the caller's account's task ``task_id``: what was done, or None when
        this shard keeps no such task (rayq.core.storage.outcomes.cancel)."""
        return await self._write(Cancel(caller.account, check_task_id(task_id)), caller.auth)

    @signed(SHARD_OPS["clear"])
    async def clear(self, subqueue: int, *, caller: Caller) -> int:
        return await self._write(Clear(subqueue), caller.auth)

    @signed(SHARD_OPS["peek"])
    async def peek(self, subqueue: int, max_messages: int = 1, *, keys=None,
                   caller: Caller) -> list:
        await self._remember(caller.auth)
        return await self._read(lambda: self.store.peek(subqueue, max_messages, keys=keys))

    @signed(SHARD_OPS["counts"])
    async def counts(self, subqueues: list[int], *, caller: Caller) -> dict[int, int]:
        await self._remember(caller.auth)
        return await self._read(lambda: {sq: self.store.count(sq) for sq in subqueues})

    @signed(SHARD_OPS["visibility_counts"])
    async def visibility_counts(self, subqueues: list[int], *, caller: Caller
                                ) -> dict[int, tuple[int, int, int]]:
        """(visible, in flight, delayed) per subqueue (SQS's approximate counts)."""
        await self._remember(caller.auth)  # a signed read is remembered: it never replays
        return await self._read(lambda: {sq: self.store.visibility_counts(sq) for sq in subqueues})

    async def set_state(self, subqueue: int, state: str) -> None:
        await self._read(self.store.set_state, subqueue, SubqueueState(state))

    async def set_ordered(self, subqueue: int) -> None:  # a FIFO queue's (ShardStore.set_ordered)
        await self._read(self.store.set_ordered, subqueue, True)

    # -- flooders ------------------------------------------------------------------
    async def set_diverts(self, diverts: dict, dedicated: list[int] = ()) -> None:
        """Flooders whose new messages to a subqueue go to the spill store, and the
        flooders' dedicated subqueues on this shard (served on their turns)."""
        await self._read(self.store.set_diverts, diverts)
        self._dedicated = frozenset(dedicated)

    async def sweep(self, type_: str, tenant: str, target: int, limit: int) -> int:
        return await self._write(Sweep(type_, tenant, target, limit))

    async def spill_left(self, type_: str, tenant: str) -> bool:
        return await self._read(self.store.spill_left, type_, tenant)

    async def move_matching(self, source: int, target: int, type_: str, tenant: str,
                            limit: int, after: bytes | None = None) -> tuple:
        return await self._write(MoveMatching(source, target, type_, tenant, limit, after))

    async def health(self, subqueue: int) -> tuple[int, bool]:
        """(messages in ``subqueue``, under memory pressure): what the sweeper checks
        before each batch it moves into ``subqueue`` (docs/flood-detection.md: the
        target's depth)."""
        return await self._read(lambda: (self.store.count(subqueue),
                                         self.store.cache.stats().under_pressure))

    # -- clearing ----------------------------------------------------------------------
    async def purge(self, subqueues: list[int]) -> None:
        """Remove subqueues in the background (a cleared or deleted queue's): they are
        disabled and count nothing from now on; the rows go PURGE_ROWS at a time."""
        await self._read(self.store.purge, subqueues)
        for sq in subqueues:
            self._parked.wake(sq, self._parked.waiting(sq))  # they find it disabled at once

    def _purge_pause_s(self) -> float:
        """Background removal runs bounded transactions one after another while there is
        work (interleaved with group commits on the store thread), and looks for work
        every EXPIRY_INTERVAL_S otherwise."""
        return PURGE_PAUSE_S if self.store.purging else EXPIRY_INTERVAL_S

    async def _purge_some(self) -> None:
        """One bounded removal transaction, if any is due; a failed one is retried by the
        next round (the marks persist, and a restarted shard resumes from them)."""
        if self.store.purging:
            self._desk.tell(await self._read(self._purge_step))

    def _purge_step(self) -> list:
        self.store.purge_some(PURGE_ROWS)
        return self.store.take_finished()

    async def flood_snapshot(self) -> dict:
        """What the flood detector needs: counts per (kind, subqueue, type, tenant),
        enqueues per window, the shard's depth and whether it is under memory pressure."""
        def read():
            stats = self.store.stats()
            return {"tenant_counts": self.store.tenant_counts(),
                    "enqueues": self.store.enqueue_counts(), "depth": stats.messages,
                    "under_pressure": stats.cache.under_pressure}
        return await self._read(read)

    @signed(SHARD_OPS["depths"])
    async def depths(self, subqueues: list[int] | None = None, *,
                     caller: Caller) -> list[KeyDepth]:
        """Depth and oldest age per (subqueue, key); only of ``subqueues`` if given (an
        account other than the admin must name its own)."""
        check_reads_own(caller.account, subqueues)
        await self._remember(caller.auth)
        return of_subqueues(await self._read(self.store.depths), subqueues)

    async def enqueue_counts(self) -> dict:
        return await self._read(self.store.enqueue_counts)

    @signed(SHARD_OPS["stats"])
    async def stats(self, *, caller: Caller) -> ShardStats:
        await self._remember(caller.auth)
        store_stats = await self._read(self.store.stats)
        return ShardStats(self.index, store_stats, self._commits, self._calls,
                          dict(self._ops), dict(self._throttled), await self._queue_counts(),
                          self.failures.total, node=self.node,
                          role=role_of(self.shipper.place, self.node))

    async def _queue_counts(self) -> dict[str, int]:
        """Messages here per queue by unambiguous name; empty while the manager is away
        (statistics never wait for it to come back). A subqueue holding messages that the
        gate's copy of the directory lacks (a queue made since) has it fetched anew."""
        held = await self._read(lambda: {sq: self.store.count(sq) for sq in self.store.holding()})
        try:
            await self.gate.known(held)
            places = await self.gate.places()
        except (ValueError, ray.exceptions.RayError):
            return {}
        mine = queues_on(places, self.index)
        return per_queue(mine, {sq: held.get(sq, 0) for sq in mine})

    async def process(self) -> dict:
        """The shard process's pid and memory: resident in all, and private (anonymous)
        memory without the LMDB file pages the kernel maps in and can drop at will."""
        info = psutil.Process().memory_info()  # on Linux `shared` is RssFile + RssShmem
        return {"pid": os.getpid(), "rss_bytes": info.rss, "private_bytes": info.rss - info.shared}

    async def _collect_events(self) -> None:
        groups = await self._read(self.store.take_enqueued)
        if groups:  # the columns are built off the event loop
            await asyncio.to_thread(self.events.append_enqueues, groups)

    @signed(SHARD_OPS["flush_events"])
    async def flush_events(self, *, caller: Caller) -> int:
        """Write buffered events now (``client.report`` does this first)."""
        await self._remember(caller.auth)
        await self._collect_events()
        return await asyncio.to_thread(self.events.flush)

    async def door(self, start) -> tuple[str, str]:
        """(host id, path) of the door through which processes on this host hand this
        shard connections (rayq.handoff). They are answered by the server ``start()``
        (awaiting a rayq.handoff.Served) runs here, started on the first ask; its calls to
        this shard stay in-process."""
        return host_id(), await self._handed.door(self._channel.serve_here, start)

    async def close_door(self) -> None:
        """Close the door and every connection handed here (their endpoint stopped)."""
        await self._handed.close()

    async def channel(self, caller_host: str | None = None) -> tuple[str, Any]:
        """(host id, where a caller on ``caller_host`` reaches this shard's channel):
        the Unix socket's path on this host; on another, ("tcp", address, port, key) on
        this node's address (None when ``StoreConfig.remote_channel`` is off). Answered
        through Ray only, so only a caller Ray let in learns the key (rayq.channel)."""
        return await self._channel.address(caller_host)

    @signed(SHARD_OPS["noisy"])
    async def noisy(self, *, caller: Caller) -> list[NoisyKey]:
        """The keys this shard's fair dispatch treats as noisy, and since when (admin)."""
        await self._remember(caller.auth)
        return await self._read(self.store.noisy)

    async def _review_dispatch(self) -> None:
        """Fair dispatch: mark keys noisy or quiet (about once a second); log the changes."""
        for change in await self._read(self.store.review_dispatch):
            log.info("shard %d: key %r of subqueue %d is %s (%s)", self.index, change.key,
                     change.subqueue, change.state, change.reason)
            self.events.append("noisy", change.at, subqueue=change.subqueue,
                               key=change.key, detail=change.reason, outcome=change.state)

    async def _collect_expired(self) -> None:
        """Housekeeping: collect expired messages, refresh the metrics, give the C heap's
        free pages back (overloaded: the next round tries again)."""
        await self._write(CollectExpired(10_000))
        stats, depths = await self._read(lambda: (self.store.stats(), self.store.depths()))
        self.metrics.update(stats, depths)
        await self._read(trim_heap)
