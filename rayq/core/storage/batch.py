"""What one write transaction of a shard does: the queue operations on rows.

A :class:`WriteBatch` lives for one transaction. It writes rows through the
transaction and records what the in-memory state must learn after the commit
(counts, new fairness keys, cache entries, flights, counters), so nothing in
memory changes for a transaction that aborts. Rows are ``(row key, value)``
pairs in the layout of :mod:`rayq.core.storage.layout`; the hot paths move values as
bytes and never decode a body.
"""

from __future__ import annotations

import inspect
import itertools
import os
import struct
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from rayq.core.storage import layout as rows
from rayq.core.auth.accounts import check_senders
from rayq.core.storage.dispatch import Event, Rehid, Released, Sent, Took
from rayq.core.kit.kv import Txn
from rayq.core.codec.model import (PREFIX, ROW_KEY, US, Ending, StoredMessage, SubqueueState,
                             check_count, check_seconds, check_subqueue, parse_receipt,
                             receipt_text, to_us)
from rayq.core.storage.outcomes import Outcome, OutcomeOps
from rayq.core.storage.picking import PickOps
from rayq.core.storage.spill import SpillOps
from rayq.core.codec.wire import Attrs, decode_put, encode_delivered
from rayq.errors import InvalidMessage, QueueDisabled, RayqError, ReceiptInvalid, StoreError

if TYPE_CHECKING:
    from rayq.core.storage.store import ShardStore

U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
EXPIRY = struct.Struct(">QQ")
CHUNK = struct.Struct(">I")
MAX_BATCH = 1000
STAT_NAMES = ("puts", "receives", "deletes", "expired", "dead_lettered", "rows_scanned",
              "spilled", "swept", "moved")
BATCH_OPS = frozenset({"put", "receive", "delete", "change_visibility", "clear",
                       "collect_expired", "finish", "defer", "sweep", "move_matching"})
_CLEAR_CHUNK = 10_000
_STALE = "pop receipt is stale: the message was deleted, received again or had its visibility changed"


class Enqueued(NamedTuple):
    """Messages of one put with the same attributes: ``count`` seqs from ``first_seq``."""

    at: float
    subqueue: int
    type: str
    tenant: str
    key: str
    first_seq: int
    count: int


def tenant_count_key(kind: str, sq: int, type_: str, tenant: str) -> bytes:
    """Key of a (type, tenant) count; names are printable, so NUL separates them."""
    return kind.encode() + CHUNK.pack(sq) + type_.encode() + b"\x00" + tenant.encode()


def first_row_at(txn: Txn, sq: int, kid: int) -> tuple[int, int] | None:
    """(visible_at µs, seq) of the first row of (subqueue, key), one seek; None without rows."""
    for row_key, _ in txn.scan("rows", PREFIX.pack(sq, kid), PREFIX.pack(sq, kid + 1)):
        return ROW_KEY.unpack(row_key)[2:]
    return None


class WriteBatch(PickOps, SpillOps, OutcomeOps):
    """The operations of one write transaction on a shard's tables."""

    def __init__(self, store: "ShardStore", txn: Txn):
        self.store, self.txn, self.config = store, txn, store.config
        self.now_us = to_us(store.clock.now())
        self.seq = store.seq
        self.new_keys: list[tuple[str, int]] = []
        self.count_deltas: dict[tuple[int, int], int] = defaultdict(int)
        # per (kind, subqueue, type, tenant): "L" live rows, "S" spilled messages
        self.tenant_deltas: dict[tuple[str, int, str, str], int] = defaultdict(int)
        self.cached: list[tuple[bytes, bytes]] = []     # rows put: row key, value
        self.uncached: list[bytes] = []                 # rows received, moved or gone
        self.enqueued: list[Enqueued] = []
        self.outcomes: list[Outcome] = []
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self._touched: dict[int, set[int]] = defaultdict(set)  # kids put per subqueue
        # for fair dispatch: flights, and (subqueue, key) pairs whose first row may have
        # moved; seal() reads their new first rows
        self.flights: list[Event] = []
        self.heads: set[tuple[int, int]] = set()
        self.new_heads: dict[tuple[int, int], tuple[int, int] | None] = {}
        self._taken: dict[tuple[int, int], int] = defaultdict(int)  # deliveries this txn
        self._budget = 0

    # -- transaction plumbing ----------------------------------------------
    def isolated(self, fn, *args, **kwargs) -> Any:
        """Run one call in a nested transaction; a RayqError (or arguments that do not fit
        ``fn``: InvalidMessage) undoes it alone and is returned. Any other exception is a
        bug of the store and propagates, aborting the whole transaction."""
        parent = self.txn
        lists = (self.new_keys, self.cached, self.uncached, self.enqueued, self.outcomes,
                 self.flights)
        marks = [len(items) for items in lists]
        saved = (dict(self.count_deltas), dict(self.stats), self.seq, dict(self.tenant_deltas),
                 dict(self._taken))
        try:
            with parent.nested() as child:
                self.txn = child
                return fn(*args, **kwargs)
        except (RayqError, TypeError) as err:
            if not isinstance(err, RayqError):
                # A TypeError is the caller's only when the arguments do not fit the
                # signature; one raised inside the operation is a store bug: it goes up
                # and aborts the whole transaction (ShardStore turns it into StoreBug).
                err = _misfit_arguments(fn, args, kwargs)
                if err is None:
                    raise
            for items, mark in zip(lists, marks):
                del items[mark:]
            self.count_deltas = defaultdict(int, saved[0])
            self.stats, self.seq = saved[1], saved[2]
            self.tenant_deltas = defaultdict(int, saved[3])
            self._taken = defaultdict(int, saved[4])
            return err
        finally:
            self.txn = parent

    def seal(self) -> None:
        """Persist counts and the sequence inside the transaction, just before commit."""
        for (sq, kid), delta in self.count_deltas.items():
            if delta:
                count = self.store.count_of(sq, kid) + delta
                if count:
                    self.txn.put("counts", PREFIX.pack(sq, kid), I64.pack(count))
                else:
                    self.txn.delete("counts", PREFIX.pack(sq, kid))
        for name, delta in self.tenant_deltas.items():
            if delta:
                count = self.store.tenant_count_of(name) + delta
                if count:
                    self.txn.put("tcounts", tenant_count_key(*name), I64.pack(count))
                else:
                    self.txn.delete("tcounts", tenant_count_key(*name))
        if self.seq != self.store.seq:  # an empty receive writes nothing: no fsync at all
            self.txn.put("meta", b"seq", U64.pack(self.seq))
        for sq, kid in self.heads:
            self.new_heads[(sq, kid)] = first_row_at(self.txn, sq, kid)

    def count(self, sq: int, kid: int, type_: str, tenant: str, delta: int) -> None:
        """Rows join (+) or leave (-) subqueue ``sq``: per key and per (type, tenant)."""
        self.count_deltas[(sq, kid)] += delta
        self.tenant_deltas[("L", sq, type_, tenant)] += delta

    def message_id(self, seq: int) -> str:
        return self.store.message_id(seq)

    def key_id(self, name: str, create: bool) -> int | None:
        kid = self.store.known_key_id(name)
        if kid is not None:
            return kid
        for new_name, new_kid in self.new_keys:
            if new_name == name:
                return new_kid
        if not create:
            return None
        raw = self.txn.get("meta", b"next_kid")
        kid = U64.unpack(raw)[0] if raw else 1
        self.txn.put("meta", b"next_kid", U64.pack(kid + 1))
        self.txn.put("keys", b"n:" + name.encode(), U64.pack(kid))
        self.new_keys.append((name, kid))
        return kid

    def key_name(self, kid: int) -> str:
        name = self.store.key_name_of(kid)
        if name is None:
            name = next(n for n, k in self.new_keys if k == kid)
        return name

    # -- put -----------------------------------------------------------------
    def put(self, subqueue: int, batch: bytes, sender: tuple | None = None) -> list[str]:
        """Store a put buffer (:mod:`rayq.core.codec.wire`); returns the message ids in order.
        ``sender`` (account, fairness key mode, task types or None): refuse messages that
        account may not send (see :func:`rayq.core.auth.accounts.check_senders`)."""
        check_subqueue(subqueue)
        config = self.config
        put = decode_put(batch, max_message_bytes=config.max_message_bytes,
                         max_delay_s=config.max_delay_s, max_ttl_s=config.max_ttl_s)
        if sender is not None:
            check_senders(sender[0], put.attrs, *sender[1:])
        if self.store.state(subqueue) is not SubqueueState.ALL:
            raise QueueDisabled(f"subqueue {subqueue} does not accept new messages")
        first = self.seq + 1
        groups = [self._group(subqueue, attrs) for attrs in put.attrs]
        blob_threshold = config.blob_threshold_bytes
        row_items, expiry_items = [], []
        for ref, body in zip(put.refs, put.bodies):
            self.seq += 1
            group = groups[ref]
            if len(body) <= blob_threshold:
                value = group.prefix + body
            else:  # the body goes to the blobs table; the row keeps a reference
                value = group.blob_prefix + self._write_blob(self.seq, body)
            if group.spill is not None:  # a flooder's new message: to the spill store
                self.spill_one(subqueue, group, self.seq, value)
            else:
                row_key = ROW_KEY.pack(subqueue, group.kid, group.visible_us, self.seq)
                row_items.append((row_key, value))
                expiry_items.append((EXPIRY.pack(group.expires_us, self.seq), row_key))
            group.seqs.append(self.seq)
        self.txn.putmulti("rows", row_items)
        self.txn.putmulti("expiry", expiry_items)
        self.cached.extend(row_items)
        for group in groups:
            self._settle_group(subqueue, group)
        self.stats["puts"] += len(put.bodies)
        return [self.message_id(seq) for seq in range(first, self.seq + 1)]

    def _group(self, sq: int, attrs: Attrs) -> "_Group":
        kid = self.key_id(attrs.key, create=True)
        ttl_us = to_us(self.config.default_ttl_s) if attrs.ttl_us is None else attrs.ttl_us
        expires_us = self.now_us + ttl_us
        flags = rows.TASK if attrs.task else 0
        tenant, type_ = attrs.tenant.encode(), attrs.type.encode()
        return _Group(attrs, kid, self.now_us + attrs.delay_us, expires_us,
                      rows.prefix(self.now_us, expires_us, flags, tenant, type_),
                      rows.prefix(self.now_us, expires_us, flags | rows.BLOB, tenant, type_),
                      self.diverted(sq, attrs))

    def _settle_group(self, sq: int, group: "_Group") -> None:
        """Counts, cache, events and flights of one attribute group of a put."""
        if not group.seqs:
            return
        attrs = group.attrs
        self.enqueued.append(Enqueued(self.now_us / US, sq, attrs.type, attrs.tenant, attrs.key,
                                      group.seqs[0], len(group.seqs)))
        if group.spill is None:
            self.count(sq, group.kid, attrs.type, attrs.tenant, len(group.seqs))
            self._touched[sq].add(group.kid)
            self.heads.add((sq, group.kid))
        self.flights.append(Sent(sq, group.kid))

    def _write_blob(self, seq: int, body: bytes) -> bytes:
        blob_id = self.store.store_id + U64.pack(seq)
        size = self.config.blob_chunk_bytes
        chunks = range(0, len(body), size)
        for i, offset in enumerate(chunks):
            self.txn.put("blobs", blob_id + CHUNK.pack(i), body[offset:offset + size])
        return rows.BLOB_REF.pack(blob_id, len(body), len(chunks))

    def body_of(self, value: bytes, meta: rows.RowMeta | None = None) -> bytes:
        meta = meta or rows.meta(value)
        if not meta.flags & rows.BLOB:
            return value[meta.body_at:]
        blob_id, size, chunks = rows.blob_ref(value, meta.body_at)
        parts = [self.txn.get("blobs", blob_id + CHUNK.pack(i)) for i in range(chunks)]
        if any(p is None for p in parts) or sum(map(len, parts)) != size:
            raise StoreError(f"blob of message {blob_id.hex()} is incomplete")
        return b"".join(parts)

    def insert(self, row_key: bytes, value: bytes, meta: rows.RowMeta) -> None:
        """Write a row into the live queue with its expiry entry and counts."""
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        self.txn.put("rows", row_key, value)
        self.txn.put("expiry", EXPIRY.pack(meta.expires_us, seq), row_key)
        self.count(sq, kid, meta.type, meta.tenant, +1)
        self._touched[sq].add(kid)
        self.heads.add((sq, kid))

    # -- receive -------------------------------------------------------------
    def receive(self, subqueue: int, max_messages: int, visibility_timeout_s: float | None,
                *, keys: Sequence[str] | None = None, max_receives: int | None = None,
                dead_letter: int | None = None, exclude: Sequence[str] | None = None) -> bytes:
        """Hide and hand out up to ``max_messages`` messages; the answer is a buffer
        (:func:`rayq.core.codec.wire.decode_delivered` reads it)."""
        check_subqueue(subqueue)
        check_count(max_messages, "max_messages", 1, MAX_BATCH)
        if visibility_timeout_s is None:
            visibility_timeout_s = self.config.default_visibility_timeout_s
        check_seconds(visibility_timeout_s, "visibility_timeout_s", 0,
                      self.config.max_visibility_timeout_s)
        _check_keys(keys)
        _check_keys(exclude)
        if max_receives is not None:
            check_count(max_receives, "max_receives", 1, 1000)
            check_subqueue(dead_letter)
        if self.store.state(subqueue) is SubqueueState.DISABLED:
            raise QueueDisabled(f"subqueue {subqueue} is disabled")
        found, skipped = self.pick(subqueue, max_messages, self.now_us, keys, max_receives,
                                   exclude)
        for row_key, value, reason in skipped:
            if reason == "expired":
                self._remove(row_key, value, Ending.EXPIRED)
                self.stats["expired"] += 1
            else:
                self._dead_letter(row_key, value, dead_letter)
        delivered = self._deliver(found, to_us(visibility_timeout_s))
        self.stats["receives"] += len(delivered)
        return encode_delivered(delivered)

    def _deliver(self, found: list[tuple[bytes, bytes]], hide_us: int) -> list[list]:
        """Hide the rows found: new nonce, one more delivery, visible again after the
        timeout. Rows are rewritten, never decoded but for their names."""
        nonces = os.urandom(8 * len(found))
        visible_us = self.now_us + hide_us
        out, moved, expiry = [], [], []
        for i, (row_key, value) in enumerate(found):
            sq, kid, _, seq = ROW_KEY.unpack(row_key)
            meta = rows.meta(value)
            nonce = nonces[8 * i:8 * i + 8]
            new_value = rows.redelivered(value, meta.dequeue_count + 1, nonce)
            new_key = ROW_KEY.pack(sq, kid, visible_us, seq)
            self.txn.delete("rows", row_key)
            moved.append((new_key, new_value))
            expiry.append((EXPIRY.pack(meta.expires_us, seq), new_key))
            self.uncached.append(row_key)
            self.heads.add((sq, kid))
            self.flights.append(Took(row_key, new_key, sq, kid, visible_us))
            self._taken[(sq, kid)] += 1
            self.store.cache.take(row_key)  # a hit: this read came from memory, not LMDB
            out.append([self.message_id(seq), receipt_text(new_key, nonce),
                        self.body_of(value, meta), meta.tenant, meta.type, self.key_name(kid),
                        meta.dequeue_count + 1, meta.enqueued_us, sq])
        self.txn.putmulti("rows", moved)
        self.txn.putmulti("expiry", expiry)
        return out

    # -- rows leaving or moving ------------------------------------------------
    def _remove(self, row_key: bytes, value: bytes, ending: Ending | None = None) -> rows.RowMeta:
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        meta = rows.meta(value)
        if meta.flags & rows.TASK and ending is not None:
            self.record(self.message_id(seq), ending)
        self.txn.delete("rows", row_key)
        self.txn.delete("expiry", EXPIRY.pack(meta.expires_us, seq))
        if meta.flags & rows.BLOB:
            self.drop_blob(value, meta)
        self.count(sq, kid, meta.type, meta.tenant, -1)
        self.uncached.append(row_key)
        self.heads.add((sq, kid))
        self.flights.append(Released(row_key, used=True))
        return meta

    def drop_blob(self, value: bytes, meta: rows.RowMeta) -> None:
        blob_id, _, chunks = rows.blob_ref(value, meta.body_at)
        for i in range(chunks):
            self.txn.delete("blobs", blob_id + CHUNK.pack(i))

    def _move(self, row_key: bytes, value: bytes, new_key: bytes) -> None:
        """Rewrite a row under another key (its value as given), with its expiry entry."""
        self.txn.delete("rows", row_key)
        self.txn.put("rows", new_key, value)
        self.txn.put("expiry", EXPIRY.pack(rows.expires_us(value), ROW_KEY.unpack(row_key)[3]),
                     new_key)
        self.uncached.append(row_key)
        self.heads.add(PREFIX.unpack(row_key[:PREFIX.size]))
        self.heads.add(PREFIX.unpack(new_key[:PREFIX.size]))

    def move_row(self, row_key: bytes, value: bytes, new_key: bytes) -> None:
        """Move a row to another subqueue, keeping its key, visibility and seq."""
        sq, kid = ROW_KEY.unpack(row_key)[:2]
        target = ROW_KEY.unpack(new_key)[0]
        meta = rows.meta(value)
        self._move(row_key, value, new_key)
        self.count(sq, kid, meta.type, meta.tenant, -1)
        self.count(target, kid, meta.type, meta.tenant, +1)
        self._touched[target].add(kid)
        self.flights.append(Released(row_key, used=False))
        self.stats["moved"] += 1

    def _dead_letter(self, row_key: bytes, value: bytes, dead_letter: int,
                     record: bool = True) -> None:
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        meta = rows.meta(value)
        self._move(row_key, value, ROW_KEY.pack(dead_letter, kid, self.now_us, seq))
        self.count(sq, kid, meta.type, meta.tenant, -1)
        self.count(dead_letter, kid, meta.type, meta.tenant, +1)
        self._touched[dead_letter].add(kid)
        self.flights.append(Released(row_key, used=True))
        self.stats["dead_lettered"] += 1
        if meta.flags & rows.TASK and record:
            self.record(self.message_id(seq), Ending.DEAD)

    def stored(self, row_key: bytes, value: bytes, receipt: str | None) -> StoredMessage:
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        meta = rows.meta(value)
        return StoredMessage(self.message_id(seq), receipt, self.body_of(value, meta),
                             meta.tenant, meta.type, self.key_name(kid), meta.dequeue_count,
                             meta.enqueued_us / US, sq)

    # -- receipts --------------------------------------------------------------
    def _resolve(self, receipt: Any) -> tuple[bytes, bytes]:
        """(row key, value) of the row a receipt holds; 8 bytes compared, nothing decoded."""
        row_key, nonce = parse_receipt(receipt)
        value = self.txn.get("rows", row_key)
        if value is None or rows.nonce_of(value) != nonce or nonce == rows.NO_NONCE:
            raise ReceiptInvalid(_STALE)
        return row_key, value

    def delete(self, receipts: Sequence[str]) -> list[str]:
        if not isinstance(receipts, (list, tuple)) or len(receipts) > MAX_BATCH:
            raise InvalidMessage(f"delete takes a list of at most {MAX_BATCH} receipts")
        invalid = []
        for receipt in receipts:
            try:
                row_key, value = self._resolve(receipt)
            except ReceiptInvalid:
                invalid.append(receipt)
                continue
            self._remove(row_key, value, Ending.DELETED)
        self.stats["deletes"] += len(receipts) - len(invalid)
        return invalid

    def change_visibility(self, receipt: str, timeout_s: float) -> str:
        return self._hide(receipt, timeout_s, undeliver=False)

    def defer(self, receipt: str, delay_s: float) -> str:
        """Put a received message back unrun for ``delay_s``: its delivery does not count
        toward ``max_receives`` (a consumer declined it, e.g. at a concurrency limit)."""
        return self._hide(receipt, delay_s, undeliver=True)

    def _hide(self, receipt: str, timeout_s: float, undeliver: bool) -> str:
        check_seconds(timeout_s, "timeout_s", 0, self.config.max_visibility_timeout_s)
        row_key, value = self._resolve(receipt)
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        dequeues = rows.meta(value).dequeue_count
        nonce = os.urandom(8)
        new_value = rows.redelivered(value, max(0, dequeues - 1) if undeliver else dequeues, nonce)
        visible_us = self.now_us + to_us(timeout_s)
        new_key = ROW_KEY.pack(sq, kid, visible_us, seq)
        self._move(row_key, new_value, new_key)
        self.flights.append(Released(row_key, used=False) if undeliver
                            else Rehid(row_key, new_key, visible_us))
        return receipt_text(new_key, nonce)

    # -- housekeeping ------------------------------------------------------------
    def clear(self, subqueue: int) -> int:
        check_subqueue(subqueue)
        removed = 0
        while True:
            chunk = list(itertools.islice(self.txn.scan("rows", PREFIX.pack(subqueue, 0),
                                                        PREFIX.pack(subqueue + 1, 0)),
                                          _CLEAR_CHUNK))
            if not chunk:
                return removed
            for row_key, value in chunk:
                self._remove(row_key, value, Ending.DELETED)
            removed += len(chunk)

    def collect_expired(self, limit: int) -> int:
        check_count(limit, "limit", 1, 10_000_000)
        stop = EXPIRY.pack(self.now_us + 1, 0)
        entries = list(itertools.islice(self.txn.scan("expiry", b"", stop), limit))
        for expiry_key, row_key in entries:
            value = self.txn.get("rows", row_key)
            if value is None:  # index entry of a row already gone
                self.txn.delete("expiry", expiry_key)
                continue
            self._remove(row_key, value, Ending.EXPIRED)
            self.stats["expired"] += 1
        return len(entries) + self._collect_outcomes(limit)

class _Group:
    """One attribute group of a put: its key, times, shared row prefixes (inline body,
    blob reference), the flooder it is spilled for (None: not diverted), and its seqs."""

    __slots__ = ("attrs", "kid", "visible_us", "expires_us", "prefix", "blob_prefix",
                 "spill", "seqs")

    def __init__(self, attrs: Attrs, kid: int, visible_us: int, expires_us: int, prefix: bytes,
                 blob_prefix: bytes, spill: str | None):
        self.attrs, self.kid, self.visible_us, self.expires_us = attrs, kid, visible_us, expires_us
        self.prefix, self.blob_prefix, self.spill = prefix, blob_prefix, spill
        self.seqs: list[int] = []


def _misfit_arguments(fn, args: tuple, kwargs: dict) -> InvalidMessage | None:
    """InvalidMessage when ``args``/``kwargs`` do not fit ``fn``'s signature, else None."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as err:
        return InvalidMessage(f"bad arguments to {getattr(fn, '__name__', fn)}: {err}")
    return None


def _check_keys(keys: Any) -> None:
    if keys is None:
        return
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
        raise InvalidMessage("keys must be a list of fairness key names")
