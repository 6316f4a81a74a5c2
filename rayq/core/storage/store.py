"""The shard store: durable queue semantics over an ordered key-value store.

Tables (LMDB named sub-databases):

- ``rows``: (subqueue, key id, visible_at µs, seq) -> row. Hidden and delayed
  rows sort after every visible row of their prefix, deleted rows are gone, so
  the oldest visible message of a (subqueue, fairness key) is the first row of
  its prefix: one cursor seek, whatever the depth (the DequeueHead of docs/shards-and-storage.md,
  kept implicitly by the key order).
- ``expiry``: (expires_at µs, seq) -> row key, so expired rows are collected
  in bounded batches without scanning the queue.
- ``blobs``: (blob id, chunk) -> bytes for bodies over the blob threshold.
- ``counts``: (subqueue, key id) -> message count (docs/shards-and-storage.md).
- ``keys``: fairness key name <-> key id; ``meta``: sequence and store id.

Every public method is one write transaction (one commit, one fsync);
:meth:`ShardStore.group` runs many calls in one transaction for group commit.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rayq.config import StoreConfig
from rayq.core.storage.dispatch import DispatchPolicy, FairDispatch, NoisyChange, NoisyKey
from rayq.core.storage.batch import (BATCH_OPS, CHUNK as U32, I64, MAX_BATCH, STAT_NAMES, U64, Enqueued,
                             WriteBatch, first_row_at)
from rayq.core.storage.cache import CacheStats, MessageCache, PressureMonitor, psutil_probe
from rayq.core.storage import purge
from rayq.core.storage import spill
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.kv import KV, Txn
from rayq.core.storage import layout as rows
from rayq.core.storage.migrate import migrate_rows
from rayq.core.codec.model import (PREFIX, ROW_KEY, US, Ending, NewMessage, StoredMessage, SubqueueState,
                             check_count, check_name, check_subqueue, to_us)
from rayq.core.codec.wire import decode_delivered, encode_messages
from rayq.core.kit.windows import WindowedSums
from rayq.errors import InvalidMessage, RayqError, StoreBug, StoreError



@dataclass(frozen=True)
class KeyDepth:
    """Depth and latency of one fairness key in one subqueue.

    latency_s: the age of the oldest visible message (0 when none is visible): from its
    enqueue, or from the end of its delay if it was never received, so a redelivery or a
    retry's back-off does not reset it (docs/fairness-coordinator.md).
    """

    subqueue: int
    key: str
    count: int
    latency_s: float
    oldest_enqueued_at: float | None


@dataclass(frozen=True)
class StoreStats:
    """Counters of one shard since it was opened, plus its current depth."""

    messages: int
    puts: int
    receives: int
    deletes: int
    expired: int
    dead_lettered: int
    rows_scanned: int
    spilled: int      # flooders' puts written to the spill store
    swept: int        # spilled messages moved back into the queue
    moved: int        # messages moved to dedicated subqueues
    cache: CacheStats
    map_size_bytes: int
    used_bytes: int


class ShardStore:
    """One shard's messages over a :class:`~rayq.core.kit.kv.KV` (LMDB in production)."""

    def __init__(self, kv: KV, *, config: StoreConfig = StoreConfig(),
                 clock: Clock | None = None, memory_probe=psutil_probe,
                 dispatch: DispatchPolicy = DispatchPolicy()):
        self.kv = kv
        self.config = config
        self.clock = clock or SystemClock()
        self.cache = MessageCache(PressureMonitor(
            self.clock, budget_bytes=config.cache_budget_bytes,
            process_limit_bytes=config.process_memory_limit_bytes,
            min_available_bytes=config.min_available_bytes,
            check_interval_s=config.pressure_check_interval_s, probe=memory_probe))
        self.enqueues = WindowedSums(config.enqueue_window_s, config.enqueue_windows)
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._key_ids: dict[str, int] = {}
        self._key_names: dict[int, str] = {}
        self._counts: dict[tuple[int, int], int] = {}
        self._sq_keys: dict[int, set[int]] = defaultdict(set)
        self._states: dict[int, SubqueueState] = {}
        self._finished: list[tuple[str, Ending, bytes]] = []  # outcomes since take_finished()
        self._tenant_counts: dict[tuple[str, int, str, str], int] = {}
        self._spilled: dict[int, int] = defaultdict(int)  # per subqueue, for count()
        self.diverts: dict[int, list[tuple[str, str]]] = {}  # subqueue -> flooders to spill
        self.keep_enqueued = False  # the shard actor turns this on to log enqueues
        self._enqueued: list[tuple] = []
        self.dispatch = FairDispatch(dispatch, self._key_names.get)
        self._seq, self.store_id = kv.transact(self._load)
        self.store_hex = self.store_id.hex()  # message ids are "<store hex>-<seq hex>"
        self.purging: set[int] = kv.read(purge.load_marks)  # cleared or deleted subqueues
        self._purge_cursor: bytes | None = None  # how far the spill table was looked at

    # -- opening ---------------------------------------------------------
    def _load(self, txn: Txn) -> tuple[int, bytes]:
        store_id = txn.get("meta", b"store_id")
        if store_id is None:
            store_id = os.urandom(6)
            txn.put("meta", b"store_id", store_id)
        migrate_rows(txn, store_id)
        seq = txn.get("meta", b"seq")
        for name, kid in txn.scan("keys", b"n:", b"n;"):
            self._remember_key(name[2:].decode(), U64.unpack(kid)[0])
        for key, value in txn.scan("meta", b"state:", b"state;"):
            self._states[U64.unpack(key[6:])[0]] = SubqueueState(value.decode())
        for key, value in txn.scan("counts", b""):
            sq, kid = PREFIX.unpack(key)
            self._counts[(sq, kid)] = I64.unpack(value)[0]
            self._sq_keys[sq].add(kid)
        for key, value in txn.scan("tcounts", b""):
            type_, tenant = key[5:].decode().split("\x00", 1)
            name = (key[:1].decode(), U32.unpack(key[1:5])[0], type_, tenant)
            self._tenant_counts[name] = I64.unpack(value)[0]
            if name[0] == "S":
                self._spilled[name[1]] += self._tenant_counts[name]
        heads = {pair: first_row_at(txn, *pair) for pair in self._counts}  # a seek each
        self.dispatch.apply([], heads, to_us(self.clock.now()))
        return (U64.unpack(seq)[0] if seq else 0), store_id

    def _remember_key(self, name: str, kid: int) -> None:
        self._key_ids[name], self._key_names[kid] = kid, name

    # -- what a write batch reads ------------------------------------------
    @property
    def seq(self) -> int:
        """The last sequence number committed."""
        return self._seq

    def known_key_id(self, name: str) -> int | None:
        return self._key_ids.get(name)

    def key_name_of(self, kid: int) -> str | None:
        return self._key_names.get(kid)

    def count_of(self, sq: int, kid: int) -> int:
        return self._counts.get((sq, kid), 0)

    def tenant_count_of(self, name: tuple[str, int, str, str]) -> int:
        return self._tenant_counts.get(name, 0)

    # -- transactions ------------------------------------------------------
    def _run(self, fn: Callable[[WriteBatch], Any]) -> Any:
        """Run ``fn`` in one write transaction, then publish what it changed.

        A RayqError passes through. Any other exception aborts the transaction (nothing
        of it is stored, the in-memory state is untouched) and surfaces with its cause
        chained: an OSError as StoreError (the machine failed), anything else as
        StoreBug (the store's own code failed: never the caller's fault).
        """
        def body(txn: Txn):
            batch = WriteBatch(self, txn)
            result = fn(batch)
            batch.seal()
            return batch, result

        try:
            batch, result = self.kv.transact(body)
        except RayqError:
            raise
        except OSError as err:  # the machine failed underneath (disk, memory map)
            raise StoreError(f"the storage failed: {err!r}") from err
        except Exception as err:
            raise StoreBug(f"the store failed on a valid request: {err!r}") from err
        self._apply(batch)
        return result

    def group(self, calls: Sequence[tuple[str, tuple, dict]],
              also: Callable[[Txn], None] | None = None) -> list[Any]:
        """Run many calls in one write transaction (group commit).

        Each call runs in a nested transaction: one that raises a RayqError is
        rolled back alone and its exception takes its place in the results.
        ``also(txn)`` writes in the same transaction, before the calls (the shard
        records the signed requests' nonces this way: durable exactly when they are).
        """
        def run(batch: WriteBatch) -> list[Any]:
            if also is not None:
                also(batch.txn)
            results = []
            for name, args, kwargs in calls:
                if name not in BATCH_OPS:
                    results.append(InvalidMessage(f"unknown store operation {name!r}"))
                    continue
                results.append(batch.isolated(getattr(batch, name), *args, **kwargs))
            return results
        return self._run(run)

    def _apply(self, batch: WriteBatch) -> None:
        """After commit: publish what the transaction changed to the in-memory state."""
        self._seq = batch.seq
        for name, kid in batch.new_keys:
            self._remember_key(name, kid)
        for (sq, kid), delta in batch.count_deltas.items():
            count = self._counts.get((sq, kid), 0) + delta
            if count:
                self._counts[(sq, kid)] = count
                self._sq_keys[sq].add(kid)
            else:
                self._counts.pop((sq, kid), None)
                self._sq_keys[sq].discard(kid)
        for row_key in batch.uncached:
            self.cache.discard(row_key)
        for row_key, value in batch.cached:
            self.cache.add(row_key, value)
        for group in batch.enqueued:
            self.enqueues.add((group.subqueue, group.type, group.tenant), group.count, group.at)
        if self.keep_enqueued:
            self._enqueued.extend(batch.enqueued)
        self._finished.extend(batch.outcomes)
        for name, delta in batch.tenant_deltas.items():
            if name[0] == "S":
                self._spilled[name[1]] += delta
            count = self._tenant_counts.get(name, 0) + delta
            if count:
                self._tenant_counts[name] = count
            else:
                self._tenant_counts.pop(name, None)
        for name, n in batch.stats.items():
            self._stats[name] += n
        self.dispatch.apply(batch.flights, batch.new_heads, batch.now_us)

    # -- public operations (each one transaction) ---------------------------
    def put(self, subqueue: int, messages: Sequence[NewMessage]) -> list[str]:
        """Store messages durably; returns their ids in order."""
        if not isinstance(messages, (list, tuple)):
            raise InvalidMessage("put takes a list of NewMessage values")
        return self.put_batch(subqueue, encode_messages(messages))

    def put_batch(self, subqueue: int, batch: bytes) -> list[str]:
        """Store a put buffer (:mod:`rayq.core.codec.wire`) durably; returns the ids in order."""
        return self._run(lambda b: b.put(subqueue, batch))

    def receive(self, subqueue: int, max_messages: int = 1, visibility_timeout_s: float | None = None,
                *, keys: Sequence[str] | None = None, max_receives: int | None = None,
                dead_letter: int | None = None,
                exclude: Sequence[str] | None = None) -> list[StoredMessage]:
        """Hide and return up to ``max_messages`` visible messages with fresh pop receipts.

        ``keys`` gives a listen order (take from the first key first); without
        it the oldest visible messages across keys come first, except those of
        keys in ``exclude``. A message already received ``max_receives`` times
        moves to subqueue ``dead_letter`` instead of being delivered.
        """
        return decode_delivered(self._run(lambda b: b.receive(
            subqueue, max_messages, visibility_timeout_s, keys=keys, max_receives=max_receives,
            dead_letter=dead_letter, exclude=exclude)))

    def delete(self, receipts: Sequence[str]) -> list[str]:
        """Delete the messages of valid receipts; returns the receipts that were invalid."""
        return self._run(lambda b: b.delete(receipts))

    def change_visibility(self, receipt: str, timeout_s: float) -> str:
        """Hide a received message for ``timeout_s`` from now; returns its new receipt."""
        return self._run(lambda b: b.change_visibility(receipt, timeout_s))

    def finish(self, receipt: str, outcome: bytes, dead_letter: int | None = None) -> None:
        """End a received task message with an outcome (see :meth:`WriteBatch.finish`)."""
        return self._run(lambda b: b.finish(receipt, outcome, dead_letter))

    def outcome(self, message_id: str) -> tuple[Ending, bytes] | None:
        """How a task message ended, or None while it has not (or its outcome expired)."""
        [found] = self.outcomes([message_id])
        return found

    def outcomes(self, message_ids: Sequence[str]) -> list[tuple[Ending, bytes] | None]:
        """:meth:`outcome` of each id, read in one transaction."""
        for message_id in message_ids:
            if not isinstance(message_id, str) or not 0 < len(message_id) <= 64:
                raise InvalidMessage(f"not a message id: {message_id!r:.80}")
        values = self.kv.read(lambda txn: [txn.get("outcomes", mid.encode())
                                           for mid in message_ids])
        return [None if value is None else (Ending(value[8]), bytes(value[9:]))
                for value in values]

    def take_enqueued(self) -> tuple[str, list[Enqueued]]:
        """(message id prefix, the groups of messages put since the last call), when
        ``keep_enqueued`` is on (for the event log): one group per put and attributes,
        its ids the prefix and ``count`` seqs from ``first_seq`` in hex."""
        groups, self._enqueued = self._enqueued, []
        return f"{self.store_hex}-", groups

    def take_finished(self) -> list[tuple[str, Ending, bytes]]:
        """(message id, ending, payload) of every outcome recorded since the last call."""
        finished, self._finished = self._finished, []
        return finished

    def defer(self, receipt: str, delay_s: float) -> str:
        """Put a received message back unrun (see :meth:`WriteBatch.defer`); a new receipt."""
        return self._run(lambda b: b.defer(receipt, delay_s))

    def clear(self, subqueue: int) -> int:
        """Delete every message of a subqueue, spilled ones too, in one transaction;
        returns how many were deleted. (Queues clear through :meth:`purge`.)"""
        def run(b: WriteBatch) -> int:
            removed = b.clear(subqueue)
            after = None
            while True:  # the whole spill table: this is the small, synchronous path
                n, after = purge.remove_spilled(b, {subqueue}, 10_000, after)
                removed += n
                if after is None:
                    return removed
        return self._run(run)

    def purge(self, subqueues: Sequence[int]) -> None:
        """Remove subqueues in the background: from now on they are disabled, count
        nothing and deliver nothing; :meth:`purge_some` removes their rows and spilled
        messages. Persisted: a reopened store goes on with them. O(subqueues)."""
        wanted = [check_subqueue(sq) for sq in subqueues]
        self.kv.transact(lambda txn: purge.mark(txn, wanted))
        for sq in wanted:
            self._states[sq] = SubqueueState.DISABLED
        self.purging |= set(wanted)
        self._purge_cursor = None

    def purge_some(self, limit: int = 2_000) -> int:
        """One bounded transaction of background removal: up to ``limit`` rows and
        ``limit`` spill entries looked at. Returns how many messages went (the work
        is over when :attr:`purging` is empty)."""
        if not self.purging:
            return 0
        done = purge.finished(self, self.purging)

        def run(b: WriteBatch) -> int:
            purge.unmark(b.txn, done)
            left = sorted(self.purging - set(done))
            removed = 0
            for sq in left:
                removed += purge.remove_rows(b, sq, limit - removed)
                if removed >= limit:
                    return removed
            if any(self._spilled.get(sq) for sq in left):
                n, self._purge_cursor = purge.remove_spilled(b, set(left), limit,
                                                             self._purge_cursor)
                removed += n
            return removed
        removed = self._run(run)
        self.purging -= set(done)
        return removed

    def collect_expired(self, limit: int = 10_000) -> int:
        """Delete up to ``limit`` expired messages; returns how many."""
        return self._run(lambda b: b.collect_expired(limit))

    def peek(self, subqueue: int, max_messages: int = 1, *,
             keys: Sequence[str] | None = None) -> list[StoredMessage]:
        """The messages a receive would return, without hiding them (receipt None)."""
        check_subqueue(subqueue)
        check_count(max_messages, "max_messages", 1, MAX_BATCH)
        if subqueue in self.purging:  # cleared: nothing of it shows again
            return []
        now_us = to_us(self.clock.now())

        def read(txn: Txn):
            reader = WriteBatch(self, txn)
            picked, _ = reader.pick(subqueue, max_messages, now_us, keys, None)
            return [reader.stored(key, value, None) for key, value in picked]
        return self.kv.read(read)

    def state(self, subqueue: int) -> SubqueueState:
        """A subqueue's state; subqueues never set are ``ALL``."""
        return self._states.get(subqueue, SubqueueState.ALL)

    def set_state(self, subqueue: int, state: SubqueueState) -> None:
        """Persist a subqueue's state: ``NO_PUT`` refuses puts, ``DISABLED`` everything."""
        check_subqueue(subqueue)
        state = SubqueueState(state)
        key = b"state:" + U64.pack(subqueue)
        self.kv.transact(lambda txn: txn.put("meta", key, state.value.encode()))
        self._states[subqueue] = state

    def count(self, subqueue: int) -> int:
        """Messages of a subqueue (visible, hidden, delayed, and spilled from it):
        O(keys of that subqueue)."""
        if subqueue in self.purging:  # cleared: its rows are on their way out
            return 0
        return self.stored_count(subqueue)

    def stored_count(self, subqueue: int) -> int:
        """Rows and spilled messages a subqueue still has on disk, cleared or not."""
        live = sum(self._counts.get((subqueue, kid), 0) for kid in self._sq_keys.get(subqueue, ()))
        return live + self._spilled.get(subqueue, 0)

    def visibility_counts(self, subqueue: int) -> tuple[int, int, int]:
        """(visible, in flight, delayed) messages of a subqueue: one seek per fairness key,
        then only hidden rows are read (in flight: received before; delayed: never yet).
        Expired rows not yet collected count as visible."""
        check_subqueue(subqueue)
        now_us = to_us(self.clock.now())

        def read(txn: Txn) -> tuple[int, int, int]:
            in_flight = delayed = 0
            for kid in self._sq_keys.get(subqueue, ()):
                for _, value in txn.scan("rows", ROW_KEY.pack(subqueue, kid, now_us + 1, 0),
                                         PREFIX.pack(subqueue, kid + 1)):
                    if rows.meta(value).dequeue_count:
                        in_flight += 1
                    else:
                        delayed += 1
            return max(0, self.count(subqueue) - in_flight - delayed), in_flight, delayed
        return self.kv.read(read)

    def tenant_counts(self) -> dict[tuple[str, int, str, str], int]:
        """Messages per (kind, subqueue, type, tenant): kind "L" live, "S" spilled."""
        return dict(self._tenant_counts)

    def set_diverts(self, diverts: dict[int, list[tuple[str, str]]]) -> None:
        """Which (type, tenant) puts to each subqueue go to the spill store from now on."""
        if not isinstance(diverts, dict):
            raise InvalidMessage("diverts maps subqueues to lists of (type, tenant)")
        self.diverts = {check_subqueue(sq): [(check_name(t, "type"), check_name(w, "tenant"))
                                             for t, w in pairs] for sq, pairs in diverts.items()}

    def sweep(self, type_: str, tenant: str, target: int, limit: int) -> int:
        """Move up to ``limit`` spilled messages of a flooder into ``target`` (one transaction)."""
        return self._run(lambda b: b.sweep(type_, tenant, target, limit))

    def spill_left(self, type_: str, tenant: str) -> bool:
        """Whether anything is spilled under flooder (type, tenant): one seek."""
        return self.kv.read(lambda txn: spill.any_spilled(txn, self._key_ids, type_, tenant))

    def move_matching(self, source: int, target: int, type_: str, tenant: str, limit: int,
                      after: bytes | None = None) -> tuple[int, bytes | None]:
        """Move a flooder's visible messages between subqueues, ``limit`` rows a call."""
        return self._run(lambda b: b.move_matching(source, target, type_, tenant, limit, after))

    def counts(self) -> dict[tuple[int, str], int]:
        """Messages per (subqueue, fairness key), zero entries left out."""
        return {(sq, self._key_names[kid]): n for (sq, kid), n in self._counts.items() if n}

    def depths(self) -> list[KeyDepth]:
        """Depth and latency per (subqueue, fairness key): one seek per pair."""
        now_us = to_us(self.clock.now())

        def read(txn: Txn) -> list[KeyDepth]:
            out = []
            for (sq, kid), n in self._counts.items():
                if n <= 0:
                    continue
                latency, oldest = 0.0, None
                for row_key, value in txn.scan("rows", PREFIX.pack(sq, kid), PREFIX.pack(sq, kid + 1)):
                    visible_us = ROW_KEY.unpack(row_key)[2]
                    oldest = rows.enqueued_us(value) / US
                    if visible_us <= now_us:  # else every row of the key is hidden
                        latency = (now_us - rows.waiting_since_us(value, visible_us)) / US
                    break
                out.append(KeyDepth(sq, self._key_names[kid], n, latency, oldest))
            return out
        return self.kv.read(read)

    def review_dispatch(self) -> list[NoisyChange]:
        """Mark keys noisy or quiet (SQS fair queues' rule); the changes since last time."""
        return self.dispatch.review(self.clock.now())

    def noisy(self) -> list[NoisyKey]:
        """The keys fair dispatch treats as noisy now, per subqueue, and since when."""
        return self.dispatch.noisy(self.clock.now())

    def enqueue_counts(self) -> dict[tuple[int, str, str], list[float]]:
        """Enqueues per (subqueue, type, tenant) per window over the look-back, oldest first."""
        return self.enqueues.snapshot(self.clock.now())

    def stats(self) -> StoreStats:
        info = self.kv.info()
        return StoreStats(messages=sum(self._counts.values()), cache=self.cache.stats(),
                          map_size_bytes=info["map_size_bytes"], used_bytes=info["used_bytes"],
                          **self._stats)

    def close(self) -> None:
        self.kv.close()




def open_store(path, *, config: StoreConfig = StoreConfig(), clock: Clock | None = None,
               memory_probe=psutil_probe, dispatch: DispatchPolicy = DispatchPolicy()) -> ShardStore:
    """Open (or create) the LMDB-backed store of one shard at ``path``."""
    from rayq.core.kit.kv import LmdbKV

    kv = LmdbKV(path, map_size=config.initial_map_bytes, durable=config.durable)
    return ShardStore(kv, config=config, clock=clock, memory_probe=memory_probe, dispatch=dispatch)
