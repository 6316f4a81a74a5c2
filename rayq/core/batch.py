"""What one write transaction of a shard does: the queue operations on rows.

A :class:`WriteBatch` lives for one transaction. It writes rows through the
transaction and records what the in-memory state must learn after the commit
(counts, new fairness keys, cache entries, counters), so nothing in memory
changes for a transaction that aborts.
"""

from __future__ import annotations

import heapq
import itertools
import os
import struct
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayq.core import spill
from rayq.core.dispatch import Event, Rehid, Released, Sent, Took
from rayq.core.kv import Txn
from rayq.core.model import (PREFIX, ROW_KEY, US, Ending, NewMessage, Receipt, Row,
                             StoredMessage, SubqueueState, check_count, check_key, check_name,
                             check_seconds, decode_row, encode_row, to_us)
from rayq.errors import (InvalidMessage, MessageTooLarge, QueueDisabled, RayqError,
                         ReceiptInvalid, StoreError)

if TYPE_CHECKING:
    from rayq.core.store import ShardStore

U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
EXPIRY = struct.Struct(">QQ")
CHUNK = struct.Struct(">I")
MAX_BATCH = 1000
MAX_SUBQUEUE = 2**32 - 2
STAT_NAMES = ("puts", "receives", "deletes", "expired", "dead_lettered", "rows_scanned",
              "spilled", "swept", "moved")
BATCH_OPS = frozenset({"put", "receive", "delete", "change_visibility", "clear",
                       "collect_expired", "finish", "defer", "sweep", "move_matching"})
MAX_OUTCOME_BYTES = 16 << 20
_CLEAR_CHUNK = 10_000


def tenant_count_key(kind: str, sq: int, type_: str, tenant: str) -> bytes:
    """Key of a (type, tenant) count; names are printable, so NUL separates them."""
    return kind.encode() + CHUNK.pack(sq) + type_.encode() + b"\x00" + tenant.encode()


def first_row_at(txn: Txn, sq: int, kid: int) -> tuple[int, int] | None:
    """(visible_at µs, seq) of the first row of (subqueue, key), one seek; None without rows."""
    for row_key, _ in txn.scan("rows", PREFIX.pack(sq, kid), PREFIX.pack(sq, kid + 1)):
        return ROW_KEY.unpack(row_key)[2:]
    return None


def check_subqueue(subqueue: Any) -> int:
    return check_count(subqueue, "subqueue", 0, MAX_SUBQUEUE)


class WriteBatch:
    """The operations of one write transaction on a shard's tables."""

    def __init__(self, store: "ShardStore", txn: Txn):
        self.store, self.txn, self.config = store, txn, store.config
        self.now_us = to_us(store.clock.now())
        self.seq = store._seq
        self.new_keys: list[tuple[str, int]] = []
        self.count_deltas: dict[tuple[int, int], int] = defaultdict(int)
        # per (kind, subqueue, type, tenant): "L" live rows, "S" spilled messages
        self.tenant_deltas: dict[tuple[str, int, str, str], int] = defaultdict(int)
        self.effects: list[tuple] = []
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
        """Run one call in a nested transaction; a RayqError undoes it alone and is returned."""
        parent = self.txn
        mark = (len(self.new_keys), len(self.effects), dict(self.count_deltas),
                dict(self.stats), self.seq, dict(self.tenant_deltas), len(self.flights),
                dict(self._taken))
        try:
            with parent.nested() as child:
                self.txn = child
                return fn(*args, **kwargs)
        except (RayqError, TypeError, ValueError) as err:  # the caller's fault: undo this call alone
            if not isinstance(err, RayqError):
                err = InvalidMessage(f"bad arguments to {getattr(fn, '__name__', fn)}: {err}")
            del self.new_keys[mark[0]:], self.effects[mark[1]:]
            self.count_deltas = defaultdict(int, mark[2])
            self.stats, self.seq = mark[3], mark[4]
            self.tenant_deltas = defaultdict(int, mark[5])
            del self.flights[mark[6]:]
            self._taken = defaultdict(int, mark[7])
            return err
        finally:
            self.txn = parent

    def seal(self) -> None:
        """Persist counts and the sequence inside the transaction, just before commit."""
        for (sq, kid), delta in self.count_deltas.items():
            if not delta:
                continue
            count = self.store._counts.get((sq, kid), 0) + delta
            if count:
                self.txn.put("counts", PREFIX.pack(sq, kid), I64.pack(count))
            else:
                self.txn.delete("counts", PREFIX.pack(sq, kid))
        for name, delta in self.tenant_deltas.items():
            if not delta:
                continue
            count = self.store._tenant_counts.get(name, 0) + delta
            if count:
                self.txn.put("tcounts", tenant_count_key(*name), I64.pack(count))
            else:
                self.txn.delete("tcounts", tenant_count_key(*name))
        self.txn.put("meta", b"seq", U64.pack(self.seq))
        for sq, kid in self.heads:
            self.new_heads[(sq, kid)] = first_row_at(self.txn, sq, kid)

    def count(self, sq: int, kid: int, row: Row, delta: int) -> None:
        """A row joins (+1) or leaves (-1) subqueue ``sq``: per key and per (type, tenant)."""
        self.count_deltas[(sq, kid)] += delta
        self.tenant_deltas[("L", sq, row.type, row.tenant)] += delta

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def key_id(self, name: str, create: bool) -> int | None:
        kid = self.store._key_ids.get(name)
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
        name = self.store._key_names.get(kid)
        if name is None:
            name = next(n for n, k in self.new_keys if k == kid)
        return name

    # -- put -----------------------------------------------------------------
    def put(self, subqueue: int, messages: Sequence[NewMessage]) -> list[str]:
        check_subqueue(subqueue)
        if not isinstance(messages, (list, tuple)) or not 1 <= len(messages) <= MAX_BATCH:
            raise InvalidMessage(f"put takes a list of 1 to {MAX_BATCH} messages")
        for message in messages:  # validate all before writing any
            self._check_message(message)
        if self.store.state(subqueue) is not SubqueueState.ALL:
            raise QueueDisabled(f"subqueue {subqueue} does not accept new messages")
        ids = []
        for message in messages:
            flooder = spill.diverted(self.store, subqueue, message)
            if flooder is None:
                ids.append(self._put_one(subqueue, message))
            else:  # a flooder's new message: to the spill store, not the live queue
                ids.append(spill.spill_one(self, subqueue, message, flooder))
        self.stats["puts"] += len(messages)
        return ids

    def _check_message(self, m: Any) -> None:
        if not isinstance(m, NewMessage) or not isinstance(m.body, bytes) or not m.body:
            raise InvalidMessage("put takes NewMessage values with encoded bytes bodies")
        if len(m.body) - 1 > self.config.max_message_bytes:
            raise MessageTooLarge(f"body is {len(m.body) - 1} bytes; "
                                  f"the limit is {self.config.max_message_bytes}")
        check_name(m.tenant, "tenant"), check_name(m.type, "type"), check_key(m.key)
        check_seconds(m.delay_s, "delay_s", 0, self.config.max_delay_s)
        if m.ttl_s is not None:
            check_seconds(m.ttl_s, "ttl_s", 0.001, self.config.max_ttl_s)

    def new_row(self, m: NewMessage) -> tuple[int, int, Row]:
        """(seq, key id, row) of a message being stored; a large body goes to blobs."""
        seq, kid = self._next_seq(), self.key_id(m.key, create=True)
        ttl_s = self.config.default_ttl_s if m.ttl_s is None else m.ttl_s
        message_id = f"{self.store.store_id.hex()}-{seq:x}"
        inline = len(m.body) <= self.config.blob_threshold_bytes
        blob = None if inline else self._write_blob(seq, m.body)
        row = Row(message_id, m.tenant, m.type, self.now_us, self.now_us + to_us(ttl_s), 0, b"",
                  m.body if inline else None, blob, bool(m.task))
        return seq, kid, row

    def insert(self, row_key: bytes, row: Row) -> None:
        """Write a row into the live queue with its expiry entry and counts."""
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        self.txn.put("rows", row_key, encode_row(row))
        self.txn.put("expiry", EXPIRY.pack(row.expires_at_us, seq), row_key)
        self.count(sq, kid, row, +1)
        self._touched[sq].add(kid)
        self.heads.add((sq, kid))

    def _put_one(self, sq: int, m: NewMessage) -> str:
        seq, kid, row = self.new_row(m)
        row_key = ROW_KEY.pack(sq, kid, self.now_us + to_us(m.delay_s), seq)
        self.insert(row_key, row)
        self.flights.append(Sent(sq, kid))
        self.effects.append(("cache", row_key, row, m.body))
        self.effects.append(("enqueue", (sq, m.type, m.tenant), self.now_us / US, row.id, m.key))
        return row.id

    def _write_blob(self, seq: int, body: bytes) -> tuple:
        blob_id = self.store.store_id + U64.pack(seq)
        size = self.config.blob_chunk_bytes
        chunks = range(0, len(body), size)
        for i, offset in enumerate(chunks):
            self.txn.put("blobs", blob_id + CHUNK.pack(i), body[offset:offset + size])
        return (blob_id, len(body), len(chunks))

    def body_of(self, row: Row) -> bytes:
        if row.blob is None:
            return row.body
        blob_id, size, chunks = row.blob
        parts = [self.txn.get("blobs", blob_id + CHUNK.pack(i)) for i in range(chunks)]
        if any(p is None for p in parts) or sum(map(len, parts)) != size:
            raise StoreError(f"blob of message {row.id} is incomplete")
        return b"".join(parts)

    # -- receive -------------------------------------------------------------
    def receive(self, subqueue: int, max_messages: int, visibility_timeout_s: float | None,
                *, keys: Sequence[str] | None = None, max_receives: int | None = None,
                dead_letter: int | None = None,
                exclude: Sequence[str] | None = None) -> list[StoredMessage]:
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
        for row_key, row, reason in skipped:
            if reason == "expired":
                self._remove(row_key, row, Ending.EXPIRED)
                self.stats["expired"] += 1
            else:
                self._dead_letter(row_key, row, dead_letter)
        hide_us = to_us(visibility_timeout_s)
        delivered = [self._deliver(row_key, row, hide_us) for row_key, row in found]
        self.stats["receives"] += len(delivered)
        return delivered

    def pick(self, sq: int, n: int, now_us: int, keys: Sequence[str] | None,
             max_receives: int | None, exclude: Sequence[str] | None = None) -> tuple[list, list]:
        """Find up to ``n`` deliverable rows; also the expired or dead rows stepped over.

        With ``keys`` (a listen order) take from the first key first; without, the
        shard's fair dispatch chooses (:mod:`rayq.core.dispatch`). Reads only the
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
            rows = _KeyRows(self, sq, kid, now_us, max_receives, skipped)
            while len(found) < n and (row := rows.next()) is not None:
                found.append(row)
            if len(found) >= n or self._budget <= 0:
                break
        return found, skipped

    def _pick_dispatched(self, sq: int, n: int, now_us: int, max_receives: int | None,
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
            if kid in skip:
                return
            rows = _KeyRows(self, sq, kid, now_us, max_receives, skipped)
            push(kid, rows, rows.next())

        def push(kid: int, rows: "_KeyRows", row) -> None:
            if row is not None:
                score = dispatch.score(sq, kid, ROW_KEY.unpack(row[0])[2:],
                                       self._taken[(sq, kid)] + rows.taken)
                heapq.heappush(heap, (score, next(tiebreak), kid, rows, row))

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
            _, _, kid, rows, row = heapq.heappop(heap)
            found.append(row)
            rows.taken += 1
            if len(found) >= n:
                return
            if not heap and waiting is None:  # the only key left: no more ranking
                while len(found) < n and (row := rows.next()) is not None:
                    found.append(row)
                return
            push(kid, rows, rows.next())

    def _deliver(self, row_key: bytes, row: Row, hide_us: int) -> StoredMessage:
        cached = self.store.cache.take(row_key)
        body = cached[1] if cached else self.body_of(row)
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        new_row = row._replace(dequeue_count=row.dequeue_count + 1, nonce=os.urandom(8))
        new_key = self._move(row_key, new_row, ROW_KEY.pack(sq, kid, self.now_us + hide_us, seq))
        self.flights.append(Took(row_key, new_key, sq, kid, self.now_us + hide_us))
        self._taken[(sq, kid)] += 1
        return self.stored(new_key, new_row, Receipt(new_key, new_row.nonce).encode(), body)

    def _move(self, row_key: bytes, row: Row, new_key: bytes) -> bytes:
        self.txn.delete("rows", row_key)
        self.txn.put("rows", new_key, encode_row(row))
        self.txn.put("expiry", EXPIRY.pack(row.expires_at_us, ROW_KEY.unpack(row_key)[3]), new_key)
        self.effects.append(("uncache", row_key))
        self.heads.add(PREFIX.unpack(row_key[:PREFIX.size]))
        self.heads.add(PREFIX.unpack(new_key[:PREFIX.size]))
        return new_key

    def _remove(self, row_key: bytes, row: Row, ending: Ending | None = None) -> None:
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        if row.task and ending is not None:
            self.record(row.id, ending)
        self.txn.delete("rows", row_key)
        self.txn.delete("expiry", EXPIRY.pack(row.expires_at_us, seq))
        self.drop_blob(row)
        self.count(sq, kid, row, -1)
        self.store.cache.discard(row_key)
        self.effects.append(("uncache", row_key))
        self.heads.add((sq, kid))
        self.flights.append(Released(row_key, used=True))

    def drop_blob(self, row: Row) -> None:
        if row.blob is not None:
            for i in range(row.blob[2]):
                self.txn.delete("blobs", row.blob[0] + CHUNK.pack(i))

    def move_row(self, row_key: bytes, row: Row, new_key: bytes) -> None:
        """Move a row to another subqueue, keeping its key, visibility and seq."""
        sq, kid = ROW_KEY.unpack(row_key)[:2]
        target = ROW_KEY.unpack(new_key)[0]
        self._move(row_key, row, new_key)
        self.store.cache.discard(row_key)
        self.count(sq, kid, row, -1)
        self.count(target, kid, row, +1)
        self._touched[target].add(kid)
        self.flights.append(Released(row_key, used=False))
        self.stats["moved"] += 1

    def _dead_letter(self, row_key: bytes, row: Row, dead_letter: int, record: bool = True) -> None:
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        self._move(row_key, row, ROW_KEY.pack(dead_letter, kid, self.now_us, seq))
        self.store.cache.discard(row_key)
        self.count(sq, kid, row, -1)
        self.count(dead_letter, kid, row, +1)
        self._touched[dead_letter].add(kid)
        self.flights.append(Released(row_key, used=True))
        self.stats["dead_lettered"] += 1
        if row.task and record:
            self.record(row.id, Ending.DEAD)

    def stored(self, row_key: bytes, row: Row, receipt: str | None,
               body: bytes | None = None) -> StoredMessage:
        sq, kid, _, _ = ROW_KEY.unpack(row_key)
        return StoredMessage(row.id, receipt, self.body_of(row) if body is None else body,
                             row.tenant, row.type, self.key_name(kid), row.dequeue_count,
                             row.enqueued_at_us / US, sq)

    # -- receipts --------------------------------------------------------------
    def _resolve(self, receipt: Any) -> tuple[bytes, Row]:
        parsed = Receipt.decode(receipt)
        value = self.txn.get("rows", parsed.row_key)
        row = decode_row(value) if value is not None else None
        if row is None or row.nonce != parsed.nonce or not parsed.nonce:
            raise ReceiptInvalid("pop receipt is stale: the message was deleted, "
                                 "received again or had its visibility changed")
        return parsed.row_key, row

    def delete(self, receipts: Sequence[str]) -> list[str]:
        if not isinstance(receipts, (list, tuple)) or len(receipts) > MAX_BATCH:
            raise InvalidMessage(f"delete takes a list of at most {MAX_BATCH} receipts")
        invalid = []
        for receipt in receipts:
            try:
                row_key, row = self._resolve(receipt)
            except ReceiptInvalid:
                invalid.append(receipt)
                continue
            self._remove(row_key, row, Ending.DELETED)
            self.stats["deletes"] += 1
        return invalid

    def change_visibility(self, receipt: str, timeout_s: float) -> str:
        return self._hide(receipt, timeout_s, undeliver=False)

    def defer(self, receipt: str, delay_s: float) -> str:
        """Put a received message back unrun for ``delay_s``: its delivery does not count
        toward ``max_receives`` (a consumer declined it, e.g. at a concurrency limit)."""
        return self._hide(receipt, delay_s, undeliver=True)

    def _hide(self, receipt: str, timeout_s: float, undeliver: bool) -> str:
        check_seconds(timeout_s, "timeout_s", 0, self.config.max_visibility_timeout_s)
        row_key, row = self._resolve(receipt)
        sq, kid, _, seq = ROW_KEY.unpack(row_key)
        count = max(0, row.dequeue_count - 1) if undeliver else row.dequeue_count
        new_row = row._replace(nonce=os.urandom(8), dequeue_count=count)
        new_key = self._move(row_key, new_row,
                             ROW_KEY.pack(sq, kid, self.now_us + to_us(timeout_s), seq))
        self.store.cache.discard(row_key)
        self.flights.append(Released(row_key, used=False) if undeliver
                            else Rehid(row_key, new_key, self.now_us + to_us(timeout_s)))
        return Receipt(new_key, new_row.nonce).encode()

    # -- housekeeping ------------------------------------------------------------
    def clear(self, subqueue: int) -> int:
        check_subqueue(subqueue)
        removed = 0
        while True:
            chunk = []
            for row_key, value in self.txn.scan("rows", PREFIX.pack(subqueue, 0),
                                                PREFIX.pack(subqueue + 1, 0)):
                chunk.append((row_key, decode_row(value)))
                if len(chunk) >= _CLEAR_CHUNK:
                    break
            if not chunk:
                return removed
            for row_key, row in chunk:
                self._remove(row_key, row, Ending.DELETED)
            removed += len(chunk)

    def collect_expired(self, limit: int) -> int:
        check_count(limit, "limit", 1, 10_000_000)
        stop = EXPIRY.pack(self.now_us + 1, 0)
        entries = []
        for expiry_key, row_key in self.txn.scan("expiry", b"", stop):
            entries.append((expiry_key, row_key))
            if len(entries) >= limit:
                break
        for expiry_key, row_key in entries:
            value = self.txn.get("rows", row_key)
            if value is None:  # index entry of a row already gone
                self.txn.delete("expiry", expiry_key)
                continue
            self._remove(row_key, decode_row(value), Ending.EXPIRED)
            self.stats["expired"] += 1
        return len(entries) + self._collect_outcomes(limit)

    # -- flooders (see rayq.core.spill) ------------------------------------------------
    def sweep(self, type_: str, tenant: str, target: int, limit: int) -> int:
        return spill.sweep(self, type_, tenant, target, limit)

    def move_matching(self, source: int, target: int, type_: str, tenant: str,
                      limit: int, after: bytes | None = None) -> tuple[int, bytes | None]:
        return spill.move_matching(self, source, target, type_, tenant, limit, after)

    # -- outcomes of task messages -----------------------------------------------
    def finish(self, receipt: str, outcome: bytes, dead_letter: int | None = None) -> None:
        """End a received task: record ``outcome`` and delete the message, or move it
        to subqueue ``dead_letter`` (a task that failed for the last time).
        Raises ReceiptInvalid when the receipt is stale: someone else owns it now."""
        if not isinstance(outcome, bytes) or len(outcome) > MAX_OUTCOME_BYTES:
            raise InvalidMessage(f"an outcome is at most {MAX_OUTCOME_BYTES} bytes")
        if dead_letter is not None:
            check_subqueue(dead_letter)
        row_key, row = self._resolve(receipt)
        if dead_letter is None:
            self._remove(row_key, row)
            self.stats["deletes"] += 1
        else:
            self._dead_letter(row_key, row, dead_letter, record=False)
        self.record(row.id, Ending.RESULT, outcome)

    def record(self, message_id: str, ending: Ending, payload: bytes = b"") -> None:
        expires_us = self.now_us + to_us(self.config.outcome_ttl_s)
        mid = message_id.encode()
        if self.txn.get("outcomes", mid) is not None:
            return  # a task ends once: deleting its dead letter later changes nothing
        self.txn.put("outcomes", mid, U64.pack(expires_us) + bytes([ending.value]) + payload)
        self.txn.put("outcome_expiry", U64.pack(expires_us) + mid, b"")
        self.effects.append(("outcome", (message_id, ending, payload)))

    def _collect_outcomes(self, limit: int) -> int:
        stop = U64.pack(self.now_us + 1)
        entries = [key for key, _ in itertools.islice(self.txn.scan("outcome_expiry", b"", stop), limit)]
        for key in entries:
            self.txn.delete("outcome_expiry", key)
            value = self.txn.get("outcomes", key[8:])
            if value is not None and value[:8] == key[:8]:
                self.txn.delete("outcomes", key[8:])
        return len(entries)


class _KeyRows:
    """The deliverable rows of one (subqueue, key), oldest visible first, read lazily.
    Expired rows, and rows already received ``max_receives`` times, are stepped over
    into ``skipped`` (they count against the batch's scan budget)."""

    __slots__ = ("batch", "rows", "now_us", "max_receives", "skipped", "taken")

    def __init__(self, batch: WriteBatch, sq: int, kid: int, now_us: int,
                 max_receives: int | None, skipped: list):
        self.batch, self.now_us, self.max_receives = batch, now_us, max_receives
        self.rows = batch.txn.scan("rows", PREFIX.pack(sq, kid), PREFIX.pack(sq, kid + 1))
        self.skipped, self.taken = skipped, 0

    def next(self) -> tuple[bytes, Row] | None:
        batch, cache = self.batch, self.batch.store.cache
        for row_key, value in self.rows:
            if ROW_KEY.unpack(row_key)[2] > self.now_us:
                break  # hidden and delayed rows sort after every visible one
            batch.stats["rows_scanned"] += 1
            cached = cache.get(row_key)
            row = cached[0] if cached else decode_row(value)
            if row.expires_at_us <= self.now_us:
                self.skipped.append((row_key, row, "expired"))
            elif self.max_receives is not None and row.dequeue_count >= self.max_receives:
                self.skipped.append((row_key, row, "dead"))
            else:
                return row_key, row
            batch._budget -= 1
            if batch._budget <= 0:
                break
        self.rows = iter(())
        return None


def _check_keys(keys: Any) -> None:
    if keys is None:
        return
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
        raise InvalidMessage("keys must be a list of fairness key names")
