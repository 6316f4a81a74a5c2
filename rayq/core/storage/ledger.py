"""The row bookkeeping of one write transaction, over a narrow index of the shard.

:class:`ShardIndex` is what a shard knows in memory between transactions (sequence,
key ids, counts, subqueue states); a :class:`Ledger` lives for one transaction,
reads that index, writes rows through the transaction and records what the index
and the rest of the shard must learn after the commit (count deltas, new keys,
cache entries, dispatch events, outcomes, counters), so nothing in memory changes
for a transaction that aborts. Every write of :mod:`rayq.core.storage.writes` runs
over a Ledger; the bytes are :mod:`rayq.core.storage.layout`'s.
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from rayq.config import StoreConfig
from rayq.core.codec.model import (MAX_PRIORITY, US, Ending, StoredMessage, at_s,
                                   MessageIds, SubqueueState, parse_receipt, receipt_text)
from rayq.core.kit.kv import Txn
from rayq.core.kit.tuples import quick_new
from rayq.core.storage import layout
from rayq.core.storage.cache import MessageCache
from rayq.core.storage.dispatch import Event, FairDispatch, Rehid, Released, Sent, Took
from rayq.core.storage.layout import CountKind, TenantCount
from rayq.errors import ReceiptInvalid, StoreError

STAT_NAMES = ("puts", "receives", "deletes", "expired", "dead_lettered", "rows_scanned",
              "spilled", "swept", "moved", "redriven")
_LIVE, _SPILLED = CountKind.LIVE, CountKind.SPILLED
_took, _released = quick_new(Took), quick_new(Released)  # one of them per row taken or removed
_STALE = "pop receipt is stale: the message was deleted, received again or had its visibility changed"


class Enqueued(NamedTuple):
    """Messages of one put with the same attributes, by their ids (the put made them for
    its answer: a group is kept until the event log takes it)."""

    at: float
    subqueue: int
    type: str
    tenant: str
    key: str
    ids: list[str]

    @property
    def count(self) -> int:
        return len(self.ids)


class Outcome(NamedTuple):
    """How a task message ended (recorded in this transaction); ``ending`` None: its
    recorded end was forgotten instead (redriven, it runs again)."""

    message_id: str
    ending: Ending | None
    payload: bytes


SenderCheck = Callable[..., None]  # (account, messages, key mode[, task types, own queue])


class Env:
    """What operations use besides the ledger: limits, the message cache, fair dispatch,
    and the policy the caller gives the store (flooders' diverts, a sender check)."""

    __slots__ = ("config", "cache", "dispatch", "diverts", "check_senders", "flooder_puts")

    def __init__(self, config: StoreConfig, cache: MessageCache, dispatch: FairDispatch,
                 check_senders: SenderCheck | None):
        self.config, self.cache, self.dispatch = config, cache, dispatch
        self.diverts: Mapping[int, list[tuple[str, str]]] = {}  # subqueue -> (type, tenant)
        self.check_senders = check_senders
        self.flooder_puts: Any = None  # rayq.core.storage.spill.FlooderPuts, set by the store


def first_row_at(txn: Txn, sq: int, kid: int) -> tuple[int, int] | None:
    """(visible_at µs, seq) of the first row of (subqueue, key), one seek; None without rows."""
    for row_key in txn.scan_keys("rows", *layout.key_range(sq, kid)):
        return layout.parse_row_key(row_key)[2:]
    return None


def locked_until(txn: Txn, sq: int, kid: int, now_us: int) -> int | None:
    """When the last in-flight row of (ordered subqueue, key) shows again (µs), if any
    is still in flight at ``now_us``: until then the key delivers nothing."""
    entries = txn.scan("inflight", *layout.inflight_range(sq, kid))
    until = max((layout.unpack_u64(value) for _, value in entries), default=0)
    return until if until > now_us else None


def head_of(txn: Txn, index: "ShardIndex", sq: int, kid: int,
            now_us: int) -> tuple[int, int] | None:
    """The head fair dispatch ranks (subqueue, key) by: its first row's (visible_at µs,
    seq); for a locked key of an ordered subqueue, visible when the lock ends."""
    head = first_row_at(txn, sq, kid)
    if head is not None and sq in index.ordered:
        until = locked_until(txn, sq, kid, now_us)
        if until is not None:
            return max(head[0], until), head[1]
    return head


class ShardIndex:
    """The shard's committed state in memory: what a transaction reads instead of disk."""

    def __init__(self, txn: Txn, store_id: bytes, id_key: bytes):
        self.store_id, self.store_hex, self.id_key = store_id, store_id.hex(), id_key
        self.message_id = MessageIds(self.store_hex, id_key)
        raw = txn.get("meta", layout.SEQ)
        self.seq = layout.unpack_u64(raw) if raw else 0
        self.key_ids: dict[str, int] = {}
        self.key_names: dict[int, str] = {}
        self.counts: dict[tuple[int, int], int] = {}
        self.sq_keys: dict[int, set[int]] = defaultdict(set)
        self.states: dict[int, SubqueueState] = {}
        self.tenant_counts: dict[TenantCount, int] = {}
        self.spilled: dict[int, int] = defaultdict(int)  # per subqueue
        for key, kid in txn.scan("keys", *layout.KEY_NAMES):
            self.remember_key(layout.parse_key_name(key), layout.unpack_u64(kid))
        for key, value in txn.scan("meta", *layout.meta_range(layout.STATE)):
            self.states[layout.meta_tail_int(layout.STATE, key)] = SubqueueState(value.decode())
        for key, value in txn.scan("counts", b""):
            sq, kid = layout.parse_count_key(key)
            self.counts[(sq, kid)] = layout.unpack_count(value)
            self.sq_keys[sq].add(kid)
        for key, value in txn.scan("tcounts", b""):
            self._add_tenant_count(layout.parse_tenant_count_key(key), layout.unpack_count(value))
        # subqueues whose keys deliver one at a time, in seq order (FIFO message groups)
        self.ordered: set[int] = {layout.meta_tail_int(layout.ORDERED, key) for key, _ in
                                  txn.scan("meta", *layout.meta_range(layout.ORDERED))}
        self.purging: set[int] = {layout.meta_tail_int(layout.PURGE, key) for key, _ in
                                  txn.scan("meta", *layout.meta_range(layout.PURGE))}

    def remember_key(self, name: str, kid: int) -> None:
        self.key_ids[name], self.key_names[kid] = kid, name

    def state(self, sq: int) -> SubqueueState:
        return self.states.get(sq, SubqueueState.ALL)

    def stored_count(self, sq: int) -> int:
        """Rows and spilled messages a subqueue still has on disk, cleared or not."""
        live = sum(self.counts.get((sq, kid), 0) for kid in self.sq_keys.get(sq, ()))
        return live + self.spilled.get(sq, 0)

    def _add_tenant_count(self, name: tuple, delta: int) -> None:
        if name[0] is CountKind.SPILLED:
            self.spilled[name[1]] += delta
        count = self.tenant_counts.get(name, 0) + delta
        if count:
            self.tenant_counts[TenantCount(*name)] = count
        else:
            self.tenant_counts.pop(name, None)

    def publish(self, ledger: "Ledger") -> None:
        """After commit: learn what the transaction changed."""
        self.seq = ledger.seq
        for name, kid in ledger.new_keys:
            self.remember_key(name, kid)
        for pair, delta in ledger.count_deltas.items():
            count = self.counts.get(pair, 0) + delta
            if count:
                self.counts[pair] = count
                self.sq_keys[pair[0]].add(pair[1])
            else:
                self.counts.pop(pair, None)
                self.sq_keys[pair[0]].discard(pair[1])
        for name, delta in ledger.tenant_deltas.items():
            self._add_tenant_count(name, delta)


class Ledger:
    """The rows one write transaction inserts, removes, moves and hides, and the deltas
    the shard learns from them after the commit."""

    def __init__(self, txn: Txn, index: ShardIndex, now_us: int, outcome_ttl_us: int):
        self.txn, self.index, self.now_us = txn, index, now_us
        self.outcome_ttl_us = outcome_ttl_us
        self.seq = index.seq
        self.new_keys: list[tuple[str, int]] = []
        self.count_deltas: dict[tuple[int, int], int] = defaultdict(int)
        self.tenant_deltas: dict[TenantCount, int] = defaultdict(int)
        self.cached: list[tuple[bytes, bytes]] = []     # rows put: row key, value
        self.uncached: list[bytes] = []                 # rows received, moved or gone
        self.enqueued: list[Enqueued] = []
        self.outcomes: list[Outcome] = []
        self.flights: list[Event] = []                  # for fair dispatch
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        # (subqueue, key) pairs whose first row may have moved; seal() reads them
        self.heads: set[tuple[int, int]] = set()
        self.new_heads: dict[tuple[int, int], tuple[int, int] | None] = {}
        self._touched: dict[int, set[int]] = defaultdict(set)  # kids given rows per subqueue
        self._taken: dict[tuple[int, int], int] = defaultdict(int)  # deliveries this txn

    # -- savepoints (one call of a group commit undone alone) -------------------------
    def savepoint(self) -> tuple:
        lists = (self.new_keys, self.cached, self.uncached, self.enqueued, self.outcomes,
                 self.flights)
        return (lists, [len(items) for items in lists], dict(self.count_deltas),
                dict(self.stats), self.seq, dict(self.tenant_deltas), dict(self._taken))

    def rollback(self, point: tuple) -> None:
        """Forget what was recorded since ``point`` (its writes went with their nested
        transaction)."""
        lists, marks, counts, stats, seq, tenants, taken = point
        for items, mark in zip(lists, marks):
            del items[mark:]
        self.count_deltas = defaultdict(int, counts)
        self.stats, self.seq = stats, seq
        self.tenant_deltas = defaultdict(int, tenants)
        self._taken = defaultdict(int, taken)

    def seal(self) -> None:
        """Persist counts and the sequence inside the transaction, just before commit."""
        counts, txn = self.index.counts, self.txn
        for (sq, kid), delta in self.count_deltas.items():
            if delta:
                count = counts.get((sq, kid), 0) + delta
                if count:
                    txn.put("counts", layout.count_key(sq, kid), layout.pack_count(count))
                else:
                    txn.delete("counts", layout.count_key(sq, kid))
        for name, delta in self.tenant_deltas.items():
            if delta:
                count = self.index.tenant_counts.get(name, 0) + delta
                if count:
                    txn.put("tcounts", layout.tenant_count_key(name), layout.pack_count(count))
                else:
                    txn.delete("tcounts", layout.tenant_count_key(name))
        if self.seq != self.index.seq:  # an empty receive writes nothing: no fsync at all
            txn.put("meta", layout.SEQ, layout.pack_u64(self.seq))
        for sq, kid in self.heads:
            self.new_heads[(sq, kid)] = head_of(txn, self.index, sq, kid, self.now_us)

    # -- names ---------------------------------------------------------------------
    def message_id(self, seq: int) -> str:
        return self.index.message_id(seq)

    def key_id(self, name: str, create: bool) -> int | None:
        kid = self.index.key_ids.get(name)
        if kid is not None:
            return kid
        for new_name, new_kid in self.new_keys:
            if new_name == name:
                return new_kid
        if not create:
            return None
        raw = self.txn.get("meta", layout.NEXT_KID)
        kid = layout.unpack_u64(raw) if raw else 1
        self.txn.put("meta", layout.NEXT_KID, layout.pack_u64(kid + 1))
        self.txn.put("keys", layout.key_name_key(name), layout.pack_u64(kid))
        self.new_keys.append((name, kid))
        return kid

    def key_name(self, kid: int) -> str:
        name = self.index.key_names.get(kid)
        if name is None:
            name = next(n for n, k in self.new_keys if k == kid)
        return name

    # -- counts and dispatch events ---------------------------------------------------
    def count(self, sq: int, kid: int, type_: str, tenant: str, delta: int) -> None:
        """Rows join (+) or leave (-) subqueue ``sq``: per key and per (type, tenant).
        (A plain tuple in TenantCount's order: equal to it, and quicker to build.)"""
        self.count_deltas[(sq, kid)] += delta
        self.tenant_deltas[(_LIVE, sq, type_, tenant)] += delta

    def count_spilled(self, sq: int, type_: str, tenant: str, delta: int) -> None:
        self.tenant_deltas[(_SPILLED, sq, type_, tenant)] += delta

    def joined(self, sq: int, kid: int) -> None:
        """Rows of (subqueue, key) were put or moved in: its head may have changed."""
        self._touched[sq].add(kid)
        self.heads.add((sq, kid))

    def sent(self, sq: int, kid: int) -> None:
        self.flights.append(Sent(sq, kid))

    def keys_joined(self, sq: int) -> list[int]:
        """Key ids given rows in subqueue ``sq`` in this transaction."""
        return list(self._touched[sq])

    def taken(self, sq: int, kid: int) -> int:
        """Rows of (subqueue, key) delivered in this transaction."""
        return self._taken[(sq, kid)]

    # -- rows ----------------------------------------------------------------------
    def put_rows(self, items: list[tuple[bytes, bytes]], expiry: list[tuple[bytes, bytes]]) -> None:
        """New rows (row key, value) and their expiry entries, in one C loop each."""
        self.txn.putmulti("rows", items)
        self.txn.putmulti("expiry", expiry)
        self.cached.extend(items)

    def insert(self, row_key: bytes, value: bytes, meta: layout.RowMeta) -> None:
        """Write a row into the live queue with its expiry entry and counts."""
        sq, kid, _, seq = layout.parse_row_key(row_key)
        self.txn.put("rows", row_key, value)
        self.txn.put("expiry", layout.expiry_key(meta.expires_us, seq), row_key)
        self.count(sq, kid, meta.type, meta.tenant, +1)
        self.joined(sq, kid)

    def placed_key(self, sq: int, kid: int, visible_us: int, seq: int, flags: int,
                   by_enqueue: bool = False) -> bytes:
        """The row key of a row of (subqueue, key) visible from ``visible_us``: one of
        priority p > 0 already visible sorts p bands ahead of the key's other rows
        (:func:`~rayq.core.storage.layout.sort_time`); one still hidden is noted in
        ``promote``, and a receive moves it there once it shows (:meth:`promote_due`).
        ``by_enqueue`` (a task waiting to be retried): once it shows it goes back to its
        place by its enqueue time, ahead of the younger messages that came meanwhile."""
        priority = flags >> layout.PRIORITY_AT
        if not priority and not by_enqueue:
            return layout.row_key(sq, kid, visible_us, seq)
        row_key = layout.row_key(sq, kid, layout.sort_time(visible_us, priority, self.now_us),
                                 seq)
        if visible_us > self.now_us:
            self.txn.put("promote", layout.promote_key(visible_us, seq),
                         row_key + (layout.BY_ENQUEUE if by_enqueue else b""))
        return row_key

    def promote_due(self, limit: int) -> int:
        """Move up to ``limit`` rows noted by :meth:`placed_key` that showed since they
        were hidden: to their priority's band, a retried task by its enqueue time; returns
        how many moved. An entry whose row left that key (received, moved, ended) is
        dropped."""
        due = list(itertools.islice(
            self.txn.scan("promote", b"", layout.promote_key(self.now_us + 1, 0)), limit))
        moved = 0
        for key, entry in due:
            self.txn.delete("promote", key)
            row_key = entry[:layout.ROW_KEY.size]
            value = self.txn.get("rows", row_key)
            if value is None:
                continue
            sq, kid, visible_us, seq = layout.parse_row_key(row_key)
            if entry[layout.ROW_KEY.size:] == layout.BY_ENQUEUE:
                visible_us = min(visible_us, layout.enqueued_us(value))
            new_key = layout.row_key(sq, kid, layout.sort_time(
                visible_us, layout.priority_of(layout.meta(value).flags), self.now_us), seq)
            if new_key != row_key:
                self._move(row_key, value, new_key)
                moved += 1
        return moved

    def take_rows(self, found: list[tuple[bytes, bytes]], visible_us: int,
                  nonces: bytes) -> list[tuple[bytes, bytes, layout.RowMeta, int, int, int]]:
        """Hide the rows found: a new nonce, one more delivery, visible again at
        ``visible_us``. Returns (new key, nonce, header, subqueue, key id, seq) of each,
        in order."""
        out, moved, expiry = [], [], []
        per_key: dict[tuple[int, int], int] = {}  # rows taken of each (subqueue, key)
        ordered, now_us, flights = self.index.ordered, self.now_us, self.flights
        for i, (row_key, value) in enumerate(found):
            sq, kid, _, seq = layout.parse_row_key(row_key)
            pair = (sq, kid)
            per_key[pair] = per_key.get(pair, 0) + 1
            meta = layout.meta(value)
            nonce = nonces[8 * i:8 * i + 8]
            new_value = layout.redelivered(value, meta.dequeue_count + 1, nonce,
                                         layout.first_received(meta, now_us),
                                         meta.flags & ~layout.RESTING)
            if sq in ordered:  # keeps its place; the in-flight entry hides it
                new_key = row_key
                self.txn.put("inflight", layout.inflight_key(sq, kid, seq), layout.pack_u64(visible_us))
            else:
                new_key = self.placed_key(sq, kid, visible_us, seq, meta.flags)
            moved.append((row_key, new_key, new_value))
            expiry.append((layout.expiry_key(meta.expires_us, seq), new_key))
            flights.append(_took((row_key, new_key, sq, kid, visible_us)))
            out.append((new_key, nonce, meta, sq, kid, seq))
        self.uncached.extend([row_key for row_key, _ in found])
        for pair, taken in per_key.items():
            self.heads.add(pair)
            self._taken[pair] += taken
        self.txn.move_many("rows", moved, layout.REDELIVERED_AT)
        self.txn.putmulti("expiry", expiry)
        return out

    def remove(self, row_key: bytes, value: bytes, ending: Ending | None = None) -> layout.RowMeta:
        """Delete a row for good; a task message ends with ``ending`` (None: the caller
        records its outcome)."""
        sq, kid, _, seq = layout.parse_row_key(row_key)
        meta = layout.meta(value)
        if meta.flags & layout.TASK and ending is not None:
            self.record(seq, ending, value=value)
        self.txn.delete("rows", row_key)
        self.txn.delete("expiry", layout.expiry_key(meta.expires_us, seq))
        if sq in self.index.ordered:
            self.txn.delete("inflight", layout.inflight_key(sq, kid, seq))
        if meta.flags & layout.BLOB:
            self.drop_blob(value, meta)
        self.count(sq, kid, meta.type, meta.tenant, -1)
        self.uncached.append(row_key)
        self.heads.add((sq, kid))
        self.flights.append(_released((row_key, True)))  # used
        return meta

    def _move(self, row_key: bytes, value: bytes, new_key: bytes) -> None:
        """Rewrite a row under another key, with its expiry entry: its value as given,
        which differs from the row's at most in the header a redelivery rewrites."""
        self.txn.move_many("rows", [(row_key, new_key, value)], layout.REDELIVERED_AT)
        self.txn.put("expiry", layout.expiry_key(layout.expires_us(value),
                                               layout.parse_row_key(row_key)[3]), new_key)
        self.uncached.append(row_key)
        self.heads.add(layout.pair_of(row_key))
        self.heads.add(layout.pair_of(new_key))

    def move_to(self, row_key: bytes, value: bytes, target: int, visible_us: int,
                used: bool) -> layout.RowMeta:
        """Move a row to subqueue ``target``, keeping its key and seq, visible from
        ``visible_us`` (a time, not a key's field). ``used``: its delivery ended
        (dead-lettered) rather than handed back unused."""
        sq, kid, _, seq = layout.parse_row_key(row_key)
        meta = layout.meta(value)
        if sq in self.index.ordered:
            self.txn.delete("inflight", layout.inflight_key(sq, kid, seq))
        self._move(row_key, value, self.placed_key(target, kid, visible_us, seq, meta.flags))
        self.count(sq, kid, meta.type, meta.tenant, -1)
        self.count(target, kid, meta.type, meta.tenant, +1)
        self._touched[target].add(kid)
        self.flights.append(Released(row_key, used=used))
        return meta

    def rehide(self, row_key: bytes, value: bytes, visible_us: int, undeliver: bool,
               resting: bool = False) -> str:
        """Hide a received row until ``visible_us`` under a new nonce; returns its new
        receipt. ``undeliver``: its delivery does not count (handed back unrun);
        ``resting``: its delivery ended, no consumer holds it (flag RESTING)."""
        sq, kid, _, seq = layout.parse_row_key(row_key)
        meta = layout.meta(value)
        dequeues = max(0, meta.dequeue_count - 1) if undeliver else meta.dequeue_count
        nonce = os.urandom(8)  # a row back at no receives was never received
        new_value = layout.redelivered(value, dequeues, nonce,
                                     meta.first_received_us if dequeues else 0,
                                     meta.flags | layout.RESTING if resting else None)
        if sq in self.index.ordered:  # keeps its place; the in-flight entry hides it
            new_key = row_key
            self.txn.put("inflight", layout.inflight_key(sq, kid, seq), layout.pack_u64(visible_us))
        else:  # a retry goes back to its place by enqueue time once it shows
            new_key = self.placed_key(sq, kid, visible_us, seq, meta.flags,
                                      by_enqueue=resting and not undeliver)
        self._move(row_key, new_value, new_key)
        self.flights.append(Released(row_key, used=False) if undeliver
                            else Rehid(row_key, new_key, visible_us))
        return receipt_text(new_key, nonce)

    def resolve(self, receipt: Any) -> tuple[bytes, bytes]:
        """(row key, value) of the row a receipt holds; 8 bytes compared, nothing decoded."""
        row_key, nonce = parse_receipt(receipt)
        value = self.txn.get("rows", row_key)
        if value is None:  # shown again since, and moved to its priority's band?
            row_key, value = self._promoted(row_key)
        if value is None or layout.nonce_of(value) != nonce or nonce == layout.NO_NONCE:
            raise ReceiptInvalid(_STALE)
        return row_key, value

    def _promoted(self, row_key: bytes) -> tuple[bytes, bytes | None]:
        """Where :meth:`promote_due` moved the row hidden at ``row_key``, and its value
        (None: it is not there either): a receipt stays good after its timeout until the
        message is received again, whatever its priority."""
        sq, kid, visible_us, seq = layout.parse_row_key(row_key)
        if visible_us > self.now_us:
            return row_key, None
        for priority in range(1, MAX_PRIORITY + 1):
            moved = layout.row_key(sq, kid, layout.sort_time(visible_us, priority, self.now_us),
                                   seq)
            value = self.txn.get("rows", moved)
            if value is not None:
                return moved, value
        return row_key, None

    # -- bodies and outcomes -----------------------------------------------------------
    def body_of(self, value: bytes, meta: layout.RowMeta | None = None) -> bytes:
        meta = meta or layout.meta(value)
        if not meta.flags & layout.BLOB:
            return value[meta.body_at:]
        blob, size, chunks = layout.blob_ref(value, meta.body_at)
        parts = [self.txn.get("blobs", layout.blob_chunk_key(blob, i)) for i in range(chunks)]
        if any(p is None for p in parts) or sum(map(len, parts)) != size:
            raise StoreError(f"blob of message {blob.hex()} is incomplete")
        return b"".join(parts)

    def drop_blob(self, value: bytes, meta: layout.RowMeta) -> None:
        blob, _, chunks = layout.blob_ref(value, meta.body_at)
        for i in range(chunks):
            self.txn.delete("blobs", layout.blob_chunk_key(blob, i))

    def stored(self, row_key: bytes, value: bytes, receipt: str | None) -> StoredMessage:
        sq, kid, _, seq = layout.parse_row_key(row_key)
        meta = layout.meta(value)
        return StoredMessage(self.message_id(seq), receipt, self.body_of(value, meta),
                             meta.tenant, meta.type, self.key_name(kid), meta.dequeue_count,
                             meta.enqueued_us / US, sq, at_s(meta.first_received_us))

    def record(self, seq: int, ending: Ending, payload: bytes = b"",
               value: bytes | None = None) -> None:
        """The outcome of task ``seq``, kept ``outcome_ttl_us``; a task ends once.
        ``value``: its row's last value (its deliveries and first start go on its record)."""
        message_id = self.message_id(seq)
        key = layout.outcome_key(message_id)
        if self.txn.get("outcomes", key) is not None:
            return  # deleting its dead letter later changes nothing
        expires = self.now_us + self.outcome_ttl_us
        self.txn.put("outcomes", key, layout.outcome_value(expires, ending, payload))
        self.txn.put("outcome_expiry", layout.outcome_expiry_key(expires, message_id), b"")
        self._stamp_task(seq, value)
        self.outcomes.append(Outcome(message_id, ending, payload))

    def _stamp_task(self, seq: int, value: bytes | None) -> None:
        """Stamp the record of task ``seq`` with its end, now, and (given its row's last
        value) its deliveries and first start."""
        found = self.txn.get("tasks", layout.task_seq_key(seq))
        if found is None:
            return  # a task stored without an id
        record = layout.TaskRecord.unpack(found)
        if value is not None:
            meta = layout.meta(value)
            record = record._replace(attempts=meta.dequeue_count,
                                     first_received_us=meta.first_received_us)
        self.txn.put("tasks", layout.task_seq_key(seq), record._replace(ended_us=self.now_us).pack())
