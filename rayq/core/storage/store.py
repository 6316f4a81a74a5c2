"""The shard store: durable queue semantics over an ordered key-value store.

The tables and their bytes are :mod:`rayq.core.storage.layout`'s. Writes come in
through one door, as records of :mod:`rayq.core.storage.writes` that run over a
:class:`~rayq.core.storage.ledger.Ledger`: :meth:`ShardStore.run` makes one in its own
write transaction (one commit, one fsync), :meth:`ShardStore.group` many in one
transaction for group commit. The other public methods read, or set a subqueue's state
and marks. Policy (which senders a put may carry, which flooders are diverted) comes
from the caller: ``check_senders`` and :meth:`set_diverts`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rayq.config import StoreConfig
from rayq.core.codec.model import (MAX_BATCH, US, Ending, KeyDepth, StoredMessage, SubqueueState,
                                   check_count, check_name, check_subqueue, to_us)
from rayq.core.codec.task_ids import check_task_id
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.kv import KV, LmdbKV, Txn
from rayq.core.kit.windows import WindowedSums
from rayq.core.storage import layout
from rayq.core.storage import messages, outcomes, purge, spill
from rayq.core.storage.outcomes import FoundTask
from rayq.core.storage.cache import CacheStats, MessageCache, PressureMonitor, psutil_probe
from rayq.core.storage.dispatch import DispatchPolicy, FairDispatch, NoisyChange, NoisyKey
from rayq.core.storage.layout import TenantCount
from rayq.core.storage.ledger import (STAT_NAMES, Enqueued, Env, Ledger, SenderCheck, ShardIndex,
                                      head_of, locked_until)
from rayq.core.storage.writes import PurgeStep, Write, check_write, run_isolated
from rayq.errors import InvalidMessage, RayqError, StoreBug, StoreError, UnknownLayout


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
    redriven: int = 0  # dead letters moved back to their queues


class ShardStore:
    """One shard's messages over a :class:`~rayq.core.kit.kv.KV` (LMDB in production).

    ``check_senders(account, messages, key_mode)`` raises when an account may not send
    the messages of a put that names a ``sender`` (the shard passes
    :func:`rayq.core.auth.accounts.check_senders`); without it such puts are refused.
    """

    def __init__(self, kv: KV, *, config: StoreConfig = StoreConfig(),
                 clock: Clock | None = None, memory_probe=psutil_probe,
                 dispatch: DispatchPolicy = DispatchPolicy(),
                 check_senders: SenderCheck | None = None):
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
        self._finished: list[tuple[str, Ending | None, bytes]] = []  # since take_finished()
        self.keep_enqueued = False  # the shard actor turns this on to log enqueues
        self._enqueued: list[Enqueued] = []
        self._outcome_ttl_us = to_us(config.outcome_ttl_s)
        self.index: ShardIndex = kv.transact(self._load)
        self.dispatch = FairDispatch(dispatch, self.index.key_names.get)
        self._env = Env(config, self.cache, self.dispatch, check_senders)
        self._env.flooder_puts = spill.FlooderPuts()  # every flooder's puts spilled
        now_us = to_us(self.clock.now())
        heads = kv.read(lambda txn: {pair: head_of(txn, self.index, *pair, now_us)
                                     for pair in self.index.counts})
        self.dispatch.apply([], heads, now_us)  # a seek per key
        self.store_id, self.store_hex = self.index.store_id, self.index.store_hex
        self._purge_cursor: bytes | None = None  # how far the spill table was looked at

    @staticmethod
    def _load(txn: Txn) -> ShardIndex:
        store_id = txn.get("meta", layout.STORE_ID)
        if store_id is None:
            store_id = os.urandom(6)
            txn.put("meta", layout.STORE_ID, store_id)
        id_key = txn.get("meta", layout.ID_KEY)
        if id_key is None:  # made once: ids stay the same across restarts
            id_key = os.urandom(16)
            txn.put("meta", layout.ID_KEY, id_key)
        check_row_format(txn)
        return ShardIndex(txn, store_id, id_key)

    @property
    def seq(self) -> int:
        """The last sequence number committed."""
        return self.index.seq

    @property
    def purging(self) -> set[int]:
        """Cleared or deleted subqueues whose messages are still being removed."""
        return self.index.purging

    @property
    def diverts(self) -> dict[int, list[tuple[str, str]]]:
        """Which (type, tenant) puts to each subqueue go to the spill store."""
        return dict(self._env.diverts)

    # -- transactions ------------------------------------------------------
    def _transact(self, fn: Callable[[Ledger], Any]) -> Any:
        """Run ``fn`` in one write transaction, then publish what it changed.

        A RayqError passes through. Any other exception aborts the transaction (nothing
        of it is stored, the in-memory state is untouched) and surfaces with its cause
        chained: an OSError as StoreError (the machine failed), anything else as
        StoreBug (the store's own code failed: never the caller's fault).
        """
        now_us = to_us(self.clock.now())

        def body(txn: Txn):
            w = Ledger(txn, self.index, now_us, self._outcome_ttl_us)
            result = fn(w)
            w.seal()
            return w, result

        try:
            w, result = self.kv.transact(body)
        except RayqError:
            raise
        except OSError as err:  # the machine failed underneath (disk, memory map)
            raise StoreError(f"the storage failed: {err!r}") from err
        except Exception as err:
            raise StoreBug(f"the store failed on a valid request: {err!r}") from err
        self._publish(w)
        return result

    def run(self, op: Write) -> Any:
        """Make one write (a record of :mod:`rayq.core.storage.writes`) in its own
        transaction: its result. Raises the RayqError it raised (InvalidMessage for
        anything that is not a write), nothing of it stored."""
        env = self._env
        return self._transact(lambda w: check_write(op).run(w, env))

    def group(self, ops: Sequence[Write], also: Callable[[Txn], None] | None = None
              ) -> list[Any]:
        """Make many writes in one transaction (group commit): a result per write.

        Each write runs in a nested transaction: one that raises a RayqError is
        rolled back alone and its exception takes its place in the results.
        ``also(txn)`` writes in the same transaction, before the writes (the shard
        records the signed requests' nonces this way: durable exactly when they are).
        """
        env = self._env

        def run(w: Ledger) -> list[Any]:
            if also is not None:
                also(w.txn)
            return [run_isolated(w, env, op) for op in ops]
        return self._transact(run)

    def _publish(self, w: Ledger) -> None:
        """After commit: publish what the transaction changed to the in-memory state."""
        self.index.publish(w)
        cache = self.cache
        for row_key, value in w.cached:
            cache.add(row_key, value)
        for row_key in w.uncached:  # after: a row put and then received in one transaction
            cache.discard(row_key)   # is read from the store next time, as received
        for group in w.enqueued:
            self.enqueues.add((group.subqueue, group.type, group.tenant), group.count, group.at)
        if self.keep_enqueued:
            self._enqueued.extend(w.enqueued)
        self._finished.extend(w.outcomes)
        for name, n in w.stats.items():
            self._stats[name] += n
        self.dispatch.apply(w.flights, w.new_heads, w.now_us)

    # -- reads --------------------------------------------------------------
    def outcome(self, message_id: str) -> tuple[Ending, bytes] | None:
        """How a task message ended, or None while it has not (or its outcome expired)."""
        [found] = self.outcomes([message_id])
        return found

    def outcomes(self, message_ids: Sequence[str]) -> list[tuple[Ending, bytes] | None]:
        """:meth:`outcome` of each id, read in one transaction."""
        _check_message_ids(message_ids)
        return self.kv.read(lambda txn: outcomes.read_outcomes(txn, message_ids))

    def task_ends(self, message_ids: Sequence[str]) -> list[tuple[Ending, bytes] | None | bool]:
        """:meth:`outcomes` of tasks submitted with ids, told apart from tasks this store
        does not keep at all (False: see :func:`outcomes.ends`)."""
        _check_message_ids(message_ids)
        return self.kv.read(lambda txn: outcomes.ends(txn, message_ids, self.index.store_hex))

    def usage_waiting(self) -> bool:
        """Whether any usage report waits to be taken (a read: nothing is written)."""
        return self.kv.read(lambda txn: next(txn.scan_keys("usage", b""), None) is not None)

    def tasks(self, account: str, task_ids: Sequence[str]) -> list[FoundTask | None]:
        """The tasks ``account`` submitted under ``task_ids``, each with its message id and
        what it is doing, read in one transaction; None for each this store does not keep."""
        for asked in task_ids:
            check_task_id(asked)
        now_us = to_us(self.clock.now())
        return self.kv.read(
            lambda txn: outcomes.look_up(txn, account, task_ids, now_us, self.message_id))

    def take_enqueued(self) -> list[Enqueued]:
        """The groups of messages put since the last call, when ``keep_enqueued`` is on
        (for the event log): one group per put and attributes."""
        groups, self._enqueued = self._enqueued, []
        return groups

    def message_id(self, seq: int) -> str:
        return self.index.message_id(seq)

    def take_finished(self) -> list[tuple[str, Ending | None, bytes]]:
        """(message id, ending, payload) of every outcome recorded since the last call, in
        commit order; an ending None: the task's recorded end was forgotten (redriven)."""
        finished, self._finished = self._finished, []
        return finished

    def purge(self, subqueues: Sequence[int]) -> None:
        """Remove subqueues in the background: from now on they are disabled, count
        nothing and deliver nothing; :meth:`purge_some` removes their rows and spilled
        messages. Persisted: a reopened store goes on with them. O(subqueues)."""
        wanted = [check_subqueue(sq) for sq in subqueues]
        self.kv.transact(lambda txn: purge.mark(txn, wanted))
        for sq in wanted:
            self.index.states[sq] = SubqueueState.DISABLED
        self.index.purging |= set(wanted)
        self._purge_cursor = None

    def purge_some(self, limit: int = 2_000) -> int:
        """One bounded transaction of background removal: up to ``limit`` rows and
        ``limit`` spill entries looked at. Returns how many messages went (the work
        is over when :attr:`purging` is empty)."""
        if not self.index.purging:
            return 0
        done = purge.finished(self.index, self.index.purging)
        removed, self._purge_cursor = self.run(PurgeStep(done, limit, self._purge_cursor))
        self.index.purging -= set(done)
        return removed

    def peek(self, subqueue: int, max_messages: int = 1, *,
             keys: Sequence[str] | None = None) -> list[StoredMessage]:
        """The messages a receive would return, without hiding them (receipt None)."""
        check_subqueue(subqueue)
        check_count(max_messages, "max_messages", 1, MAX_BATCH)
        if subqueue in self.index.purging:  # cleared: nothing of it shows again
            return []
        now_us = to_us(self.clock.now())
        return self.kv.read(lambda txn: messages.peek(
            Ledger(txn, self.index, now_us, self._outcome_ttl_us), self._env, subqueue,
            max_messages, keys))

    def state(self, subqueue: int) -> SubqueueState:
        """A subqueue's state; subqueues never set are ``ALL``."""
        return self.index.state(subqueue)

    def set_state(self, subqueue: int, state: SubqueueState) -> None:
        """Persist a subqueue's state: ``NO_PUT`` refuses puts, ``DISABLED`` everything."""
        check_subqueue(subqueue)
        state = SubqueueState(state)
        key = layout.meta_key(layout.STATE, subqueue)
        self.kv.transact(lambda txn: txn.put("meta", key, state.value.encode()))
        self.index.states[subqueue] = state

    def ordered(self, subqueue: int) -> bool:
        """Whether a subqueue is ordered (see :meth:`set_ordered`)."""
        return subqueue in self.index.ordered

    def set_ordered(self, subqueue: int, ordered: bool = True) -> None:
        """Persist whether a subqueue is *ordered* (a FIFO queue's): each fairness key
        (message group) then delivers in seq order, one batch at a time. While any
        message of a key is in flight the key delivers nothing, and a message whose
        visibility lapses comes back before the key's later messages. Set it while the
        subqueue holds no messages."""
        check_subqueue(subqueue)
        key = layout.meta_key(layout.ORDERED, subqueue)
        if ordered:
            self.kv.transact(lambda txn: txn.put("meta", key, b""))
            self.index.ordered.add(subqueue)
        else:
            self.kv.transact(lambda txn: txn.delete("meta", key))
            self.index.ordered.discard(subqueue)

    def count(self, subqueue: int) -> int:
        """Messages of a subqueue (visible, hidden, delayed, and spilled from it):
        O(keys of that subqueue)."""
        if subqueue in self.index.purging:  # cleared: its rows are on their way out
            return 0
        return self.index.stored_count(subqueue)

    def stored_count(self, subqueue: int) -> int:
        """Rows and spilled messages a subqueue still has on disk, cleared or not."""
        return self.index.stored_count(subqueue)

    def holding(self) -> set[int]:
        """The subqueues with messages here (cleared ones left out)."""
        index = self.index
        return {sq for sq in {*index.sq_keys, *index.spilled}
                if sq not in index.purging and index.stored_count(sq)}

    def visibility_counts(self, subqueue: int) -> tuple[int, int, int]:
        """(visible, in flight, delayed) messages of a subqueue: one seek per fairness key,
        then only hidden rows are read (in flight: received before; delayed: never yet).
        Expired rows not yet collected count as visible."""
        check_subqueue(subqueue)
        now_us = to_us(self.clock.now())

        def read(txn: Txn) -> tuple[int, int, int]:
            in_flight = delayed = 0
            if subqueue in self.index.ordered:  # received rows stay in place: see inflight
                in_flight = sum(1 for _, until in txn.scan(
                    "inflight", *layout.inflight_subqueue_range(subqueue))
                    if layout.unpack_u64(until) > now_us)
            for kid in self.index.sq_keys.get(subqueue, ()):
                stop = layout.key_range(subqueue, kid)[1]
                for _, value in txn.scan("rows", layout.hidden_from(subqueue, kid, now_us), stop):
                    if layout.dequeue_count(value):
                        in_flight += 1
                    else:
                        delayed += 1
            return max(0, self.count(subqueue) - in_flight - delayed), in_flight, delayed
        return self.kv.read(read)

    def tenant_counts(self) -> dict[TenantCount, int]:
        """Messages per (kind, subqueue, type, tenant): kind live or spilled."""
        return dict(self.index.tenant_counts)

    def set_diverts(self, diverts: dict[int, list[tuple[str, str]]]) -> None:
        """Which (type, tenant) puts to each subqueue go to the spill store from now on
        (a tenant "*" diverts every tenant of the type)."""
        if not isinstance(diverts, dict):
            raise InvalidMessage("diverts maps subqueues to lists of (type, tenant)")
        self._env.diverts = {
            check_subqueue(sq): [(check_name(t, "type"), check_name(w, "tenant"))
                                 for t, w in pairs] for sq, pairs in diverts.items()}
        self._env.flooder_puts.forget_others(
            {pair for pairs in self._env.diverts.values() for pair in pairs})

    def set_flooder_puts(self, policy: spill.FlooderPuts) -> None:
        """What puts of listed flooders do from now on (``FloodConfig.flooder_puts``)."""
        self._env.flooder_puts = policy

    def spill_left(self, type_: str, tenant: str) -> bool:
        """Whether anything is spilled under flooder (type, tenant): one seek."""
        return self.kv.read(lambda txn: spill.any_spilled(txn, self.index.key_ids, type_, tenant))

    def counts(self) -> dict[tuple[int, str], int]:
        """Messages per (subqueue, fairness key), zero entries left out."""
        names = self.index.key_names
        return {(sq, names[kid]): n for (sq, kid), n in self.index.counts.items() if n}

    def depths(self) -> list[KeyDepth]:
        """Depth and latency per (subqueue, fairness key): one seek per pair."""
        now_us = to_us(self.clock.now())

        def read(txn: Txn) -> list[KeyDepth]:
            out = []
            for (sq, kid), n in self.index.counts.items():
                if n <= 0:
                    continue
                latency, oldest, age, ready = 0.0, None, 0.0, None
                # a held group of an ordered subqueue waits for its consumer, not for one
                held = sq in self.index.ordered and locked_until(txn, sq, kid, now_us)
                for row_key, value in txn.scan("rows", *layout.key_range(sq, kid)):
                    visible_us = layout.visible_since(layout.parse_row_key(row_key)[2], now_us)
                    oldest = ready = layout.enqueued_us(value) / US
                    if not layout.dequeue_count(value):  # never received: it showed late
                        ready = max(oldest, visible_us / US)  # if it was sent delayed
                    if visible_us <= now_us and not held:  # else every row is hidden
                        latency = (now_us - visible_us) / US
                        age = max(latency, now_us / US - oldest)
                    break
                out.append(KeyDepth(sq, self.index.key_names[kid], n, latency, oldest, age,
                                    ready))
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
        return StoreStats(messages=sum(self.index.counts.values()), cache=self.cache.stats(),
                          map_size_bytes=info["map_size_bytes"], used_bytes=info["used_bytes"],
                          **self._stats)

    def close(self) -> None:
        self.kv.close()


def check_row_format(txn: Txn) -> None:
    """Open a store only in the row layout of :mod:`rayq.core.storage.layout`: a new,
    empty store is marked with it; one marked with another format, or holding rows
    without a mark, raises UnknownLayout (and is left as it was)."""
    found = txn.get("meta", layout.ROW_FORMAT)
    if found is None and next(txn.scan_keys("rows", b""), None) is None:
        txn.put("meta", layout.ROW_FORMAT, layout.ROW_FORMAT_NOW)
    elif found != layout.ROW_FORMAT_NOW:
        raise UnknownLayout(f"this store's rows are in format {found!r}; this rayq reads "
                            f"format {layout.ROW_FORMAT_NOW!r} only")


def _check_message_ids(message_ids: Sequence[str]) -> None:
    for asked in message_ids:
        if not isinstance(asked, str) or not 0 < len(asked) <= 64:
            raise InvalidMessage(f"not a message id: {asked!r:.80}")


def open_store(path, *, config: StoreConfig = StoreConfig(), clock: Clock | None = None,
               memory_probe=psutil_probe, dispatch: DispatchPolicy = DispatchPolicy(),
               check_senders: SenderCheck | None = None) -> ShardStore:
    """Open (or create) the LMDB-backed store of one shard at ``path``."""
    kv = LmdbKV(path, map_size=config.initial_map_bytes, durable=config.durable)
    try:
        return ShardStore(kv, config=config, clock=clock, memory_probe=memory_probe,
                          dispatch=dispatch, check_senders=check_senders)
    except BaseException:
        kv.close()  # refused (UnknownLayout) or failed: the environment is not left open
        raise
