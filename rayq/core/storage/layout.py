"""Every byte a shard stores: each table's keys and values, built and parsed here only.

Tables (LMDB named sub-databases; :data:`TABLES` names them in the order
:mod:`rayq.core.kit.kv` opens them):

- ``rows``: (subqueue, key id, visible_at µs, seq) -> row. Hidden and delayed rows
  sort after every visible row of their prefix, so the oldest visible message of a
  (subqueue, fairness key) is the first row of its prefix: one cursor seek. A visible
  row of priority p > 0 sorts p bands earlier (:func:`sort_time`), so the first row is
  the key's most urgent visible message.
- ``promote``: (visible_at µs, seq) -> row key of a hidden row of priority > 0, or of
  a task waiting to be retried (then followed by :data:`BY_ENQUEUE`): once it shows, a
  receive (or the shard's periodic expiry pass) moves it to its band
  (:func:`sort_time`), a retried task by its enqueue time, back ahead of the messages
  younger than it; an entry whose row is no longer at that key is stale and dropped.
- ``expiry``: (expires_at µs, seq) -> row key: expired rows go in bounded batches.
- ``blobs``: (blob id, chunk) -> bytes of a body over the blob threshold.
- ``counts``: (subqueue, key id) -> rows of that pair (signed 64-bit).
- ``keys``: ``n:`` fairness key name -> key id.
- ``meta``: the shard's scalars (``seq``, ``store_id``, ``id_key``, ``next_kid``, ``row_format``)
  and per-subqueue records (``state:``, ``purge:``); other modules keep records of
  their own here only through :func:`meta_key` and :func:`meta_range`.
- ``outcomes``: message id -> (expires_at µs, ending, payload) of an ended task.
- ``outcome_expiry``: (expires_at µs, message id) -> empty.
- ``spill``: (spill key id, seq) -> (source subqueue, key id, visible_at µs, row).
- ``tcounts``: (kind, subqueue, type, tenant) -> messages (kind live or spilled).
- ``nonces``: signed requests' nonces; :mod:`rayq.core.auth.nonces` owns that table.
- ``inflight``: (subqueue, key id, seq) -> visible_at µs of a received row of an
  *ordered* subqueue (``ordered:`` in ``meta``). Such a row keeps its row key when it
  is received, so it never loses its place in its key's order; this table hides it
  instead: a key with an entry still in the future is locked (nothing of it is
  delivered), and an entry in the past is a row visible again. Other subqueues have
  no entries: their received rows move to their new visible_at.
- ``task_ids``: (account, task id) -> seq of the task message submitted under that id.
- ``tasks``: seq -> a task's record (:class:`TaskRecord`): its expiry, enqueue time,
  names and id, and once it ended, when, after how many deliveries and when it first
  started. Both are written with the task's row and dropped with its outcome
  (:mod:`rayq.core.storage.outcomes`).
- ``usage``: (recorded at µs, 6 random bytes) -> a usage report of one ended delivery, as
  its consumer packed it: written with the delivery's end, taken by the fairness
  coordinator (a report outlives the consumer that ran the task).

A row value has a fixed header, then the body as sent:

    header  enqueued_at µs (8) | expires_at µs (8) | dequeue count (4) | flags (1)
            | nonce (8) | first received µs (8) | tenant bytes (2) | type bytes (2)
    then    tenant | type | body (the encoded body, or a blob reference)

Every row of one put shares its header but for nothing at all, so a put writes
``prefix + body`` per message; a receive rewrites only the dequeue count, the nonce
and (the receive that takes the dequeue count from 0 to 1) the first receive time,
which later receives keep: 0 means never received. A move (visibility change,
dead-letter, sweep) copies the value as it is,
and a pop receipt is checked by comparing 8 bytes. Nothing on these paths decodes
or re-encodes a body. A message's id is its store's id and its seq, so it is not
stored either.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from rayq.core.codec.model import PREFIX, ROW_KEY, CountKind, Ending, TenantCount
from rayq.core.kit.tuples import quick_new

TABLES = ("rows", "expiry", "blobs", "counts", "keys", "meta", "outcomes", "outcome_expiry",
          "spill", "tcounts", "nonces", "inflight", "task_ids", "tasks", "usage", "promote")

HEAD = struct.Struct(">QQIB8sQHH")
DEQUEUE = struct.Struct(">I")
RECEIVED = struct.Struct(">8sQ")     # nonce, first received µs: rewritten by each receive
BLOB_REF = struct.Struct(">14sQI")   # blob id (store id + seq), size bytes, chunks
TASK, BLOB = 1, 2                    # flags; the upper four bits carry the priority
# A task's flags while it waits: RESTING, a failed or deferred delivery waiting for its
# next one (no consumer holds it); CANCELLING, cancelled while a consumer held it (its
# consumer is told, and whatever end it makes records the task as cancelled).
RESTING, CANCELLING = 4, 8
PRIORITY_AT = 4
_FLAGS_AT = 20
NO_NONCE = bytes(8)                  # a row never received: no receipt can match it
_NONCE_AT, _NONCE_END = 21, 29
_RECEIVED_END = _NONCE_END + 8
REDELIVERED_AT = _RECEIVED_END  # a redelivered row's value is its old one from here on
_EXPIRES = slice(8, 16)
_U64 = struct.Struct(">Q")


def prefix(enqueued_us: int, expires_us: int, flags: int, tenant: bytes, type_: bytes) -> bytes:
    """The header and names shared by the rows of one put with these attributes."""
    return HEAD.pack(enqueued_us, expires_us, 0, flags, NO_NONCE, 0, len(tenant), len(type_)) \
        + tenant + type_


class RowMeta(NamedTuple):
    """A row's header fields and where its body starts."""

    enqueued_us: int
    expires_us: int
    dequeue_count: int
    flags: int
    nonce: bytes
    first_received_us: int  # 0: never received
    tenant: str
    type: str
    body_at: int

    @property
    def task(self) -> bool:
        return bool(self.flags & TASK)


_row_meta = quick_new(RowMeta)  # a row's header is read for every row a write touches
_NAMES: dict[bytes, tuple[str, str]] = {}  # decoded (tenant, type) by their raw bytes
_NAMES_KEPT = 10_000


def meta(value: bytes) -> RowMeta:
    enqueued, expires, dequeues, flags, nonce, first, tenant_len, type_len = HEAD.unpack_from(value)
    body_at = HEAD.size + tenant_len + type_len
    raw = value[HEAD.size - 4:body_at]  # both lengths and both names: unambiguous
    names = _NAMES.get(raw)
    if names is None:  # few distinct (tenant, type) pairs: decode each once
        if len(_NAMES) >= _NAMES_KEPT:
            _NAMES.clear()
        type_at = HEAD.size + tenant_len
        names = _NAMES[raw] = (value[HEAD.size:type_at].decode(), value[type_at:body_at].decode())
    return _row_meta((enqueued, expires, dequeues, flags, nonce, first, names[0], names[1],
                      body_at))


def nonce_of(value: bytes) -> bytes:
    return value[_NONCE_AT:_NONCE_END]


def expires_us(value: bytes) -> int:
    return _U64.unpack(value[_EXPIRES])[0]


def enqueued_us(value: bytes) -> int:
    return _U64.unpack(value[:8])[0]


def redelivered(value: bytes, dequeue_count: int, nonce: bytes, first_received_us: int,
                flags: int | None = None) -> bytes:
    """The same row with a new dequeue count, nonce and first receive time (µs, 0: never
    received), and new ``flags`` if given; the body is copied, not read."""
    kept = value[_FLAGS_AT:_FLAGS_AT + 1] if flags is None else bytes((flags,))
    return b"".join((value[:16], DEQUEUE.pack(dequeue_count), kept,
                     RECEIVED.pack(nonce, first_received_us), value[_RECEIVED_END:]))


def flags_of(value: bytes) -> int:
    """A row's flags, read without the rest of its header."""
    return value[_FLAGS_AT]


def with_flags(value: bytes, flags: int) -> bytes:
    """The same row with ``flags``."""
    return value[:_FLAGS_AT] + bytes((flags,)) + value[_FLAGS_AT + 1:]


def first_received(meta: RowMeta, now_us: int) -> int:
    """The first receive time (µs) a row has once received at ``now_us``: a row never
    received (0) takes ``now_us``; one received before keeps its own."""
    return meta.first_received_us or now_us


def blob_ref(value: bytes, body_at: int) -> tuple[bytes, int, int]:
    """(blob id, size bytes, chunks) of a row whose body lives in the blobs table."""
    return BLOB_REF.unpack_from(value, body_at)


# -- row keys ------------------------------------------------------------------------
# The struct methods themselves: these run per row on the hot paths.
row_key = ROW_KEY.pack              # (subqueue, key id, visible_at µs, seq) -> key
parse_row_key = ROW_KEY.unpack      # key -> (subqueue, key id, visible_at µs, seq)
pair_of = PREFIX.unpack_from        # key -> (subqueue, key id)


# -- priorities -----------------------------------------------------------------------
# A band: farther than any row waits (a row lives at most max_ttl_s, days), so the
# bands of one key never meet, and a band's rows keep their age order within it.
PRIORITY_BAND_US = 1 << 47  # about 4.5 years


def priority_of(flags: int) -> int:
    return flags >> PRIORITY_AT


def sort_time(visible_us: int, priority: int, now_us: int) -> int:
    """The visible_at field of a row key for a row visible from ``visible_us``: a row of
    priority p > 0 already visible at ``now_us`` sorts p bands before its key's rows of
    priority 0, so it is the first row of its key while visible. A row still hidden
    keeps its time (it must sort after every visible row) until it is promoted."""
    if priority and visible_us <= now_us:
        return visible_us - priority * PRIORITY_BAND_US
    return visible_us


def visible_since(field: int, now_us: int) -> int:
    """When the row whose key's visible_at field is ``field`` became visible (µs), read
    at ``now_us``: a visible row's field less its priority bands."""
    if field > now_us:
        return field
    return field + (now_us - field) // PRIORITY_BAND_US * PRIORITY_BAND_US


promote_key = struct.Struct(">QQ").pack  # (visible_at µs, seq) -> key
BY_ENQUEUE = b"e"  # after a promote entry's row key: the row goes back by its enqueue time


def key_range(sq: int, kid: int) -> tuple[bytes, bytes]:
    """Start and stop of the rows of (subqueue, key id)."""
    return PREFIX.pack(sq, kid), PREFIX.pack(sq, kid + 1)


def hidden_from(sq: int, kid: int, now_us: int) -> bytes:
    """The first row key of (subqueue, key id) not visible at ``now_us``."""
    return ROW_KEY.pack(sq, kid, now_us + 1, 0)


def subqueue_range(sq: int) -> tuple[bytes, bytes]:
    """Start and stop of every row of subqueue ``sq``."""
    return PREFIX.pack(sq, 0), PREFIX.pack(sq + 1, 0)


# -- expiry, blobs, counts, keys ----------------------------------------------------------
EXPIRY = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


expiry_key = EXPIRY.pack  # (expires_at µs, seq) -> key


def expiry_stop(now_us: int) -> bytes:
    """Expiry keys before this one are due at ``now_us``."""
    return EXPIRY.pack(now_us + 1, 0)


def blob_id(store_id: bytes, seq: int) -> bytes:
    return store_id + _U64.pack(seq)


def blob_ref_value(blob: bytes, size_bytes: int, chunks: int) -> bytes:
    """A row's body when it lives in the blobs table (see :func:`blob_ref`)."""
    return BLOB_REF.pack(blob, size_bytes, chunks)


def blob_chunk_key(blob: bytes, chunk: int) -> bytes:
    return blob + _U32.pack(chunk)


count_key = PREFIX.pack          # (subqueue, key id) -> key
parse_count_key = PREFIX.unpack


def pack_count(n: int) -> bytes:
    return _I64.pack(n)


def unpack_count(value: bytes) -> int:
    return _I64.unpack(value)[0]


_KEY_NAME = b"n:"
KEY_NAMES = (_KEY_NAME, b"n;")  # start and stop of every key name


def key_name_key(name: str) -> bytes:
    return _KEY_NAME + name.encode()


def parse_key_name(key: bytes) -> str:
    return key[len(_KEY_NAME):].decode()


def pack_u64(n: int) -> bytes:
    return _U64.pack(n)


def unpack_u64(value: bytes) -> int:
    return _U64.unpack(value)[0]


# -- meta ---------------------------------------------------------------------------------
SEQ, STORE_ID, NEXT_KID, ROW_FORMAT = b"seq", b"store_id", b"next_kid", b"row_format"
ID_KEY = b"id_key"  # the store's secret for message id tags (codec.model.message_id)
ROW_FORMAT_NOW = b"3"  # the value of ROW_FORMAT for rows in this layout
STATE, PURGE, ORDERED = "state", "purge", "ordered"


def meta_key(kind: str, tail: bytes | int = b"") -> bytes:
    """A ``meta`` record's key: ``kind:`` then ``tail`` (an int as 8 bytes)."""
    return kind.encode() + b":" + (_U64.pack(tail) if isinstance(tail, int) else tail)


def meta_range(kind: str) -> tuple[bytes, bytes]:
    """Start and stop of every ``meta`` record of ``kind``."""
    return kind.encode() + b":", kind.encode() + b";"


def meta_tail_int(kind: str, key: bytes) -> int:
    """The int a :func:`meta_key` of ``kind`` was built with."""
    return _U64.unpack(key[len(kind) + 1:])[0]


# -- in-flight rows of ordered subqueues -------------------------------------------------
INFLIGHT = struct.Struct(">IIQ")  # subqueue, key id, seq


def inflight_key(sq: int, kid: int, seq: int) -> bytes:
    return INFLIGHT.pack(sq, kid, seq)


def inflight_range(sq: int, kid: int) -> tuple[bytes, bytes]:
    """Start and stop of the in-flight entries of (subqueue, key id)."""
    return INFLIGHT.pack(sq, kid, 0), INFLIGHT.pack(sq, kid + 1, 0)


def inflight_subqueue_range(sq: int) -> tuple[bytes, bytes]:
    """Start and stop of every in-flight entry of subqueue ``sq``."""
    return INFLIGHT.pack(sq, 0, 0), INFLIGHT.pack(sq + 1, 0, 0)


# -- tenant counts ------------------------------------------------------------------------
def tenant_count_key(name: TenantCount) -> bytes:
    """Names are printable, so NUL separates type from tenant. (Any 4-tuple in
    TenantCount's order will do: ledgers key their deltas by plain tuples.)"""
    kind, sq, type_, tenant = name
    return kind.value.encode() + _U32.pack(sq) + type_.encode() + b"\x00" + tenant.encode()


def parse_tenant_count_key(key: bytes) -> TenantCount:
    type_, tenant = key[5:].decode().split("\x00", 1)
    return TenantCount(CountKind(key[:1].decode()), _U32.unpack(key[1:5])[0], type_, tenant)


# -- outcomes -----------------------------------------------------------------------------
def outcome_key(message_id: str) -> bytes:
    return message_id.encode()


def outcome_value(expires: int, ending: Ending, payload: bytes) -> bytes:
    return _U64.pack(expires) + bytes([ending.value]) + payload


def parse_outcome(value: bytes) -> tuple[Ending, bytes]:
    return Ending(value[8]), bytes(value[9:])


def outcome_expiry_key(expires: int, message_id: str) -> bytes:
    return _U64.pack(expires) + message_id.encode()


def outcome_expiry_stop(now_us: int) -> bytes:
    return _U64.pack(now_us + 1)


def outcome_of_expiry(key: bytes) -> bytes:
    """The outcomes key an outcome_expiry entry points at."""
    return key[8:]


def outcome_expires_with(value: bytes, expiry: bytes) -> bool:
    """Whether an outcome is the one an outcome_expiry entry was written for."""
    return value[:8] == expiry[:8]


def outcome_expiry_of(value: bytes, message_id: str) -> bytes:
    """The outcome_expiry key written with outcome ``value`` of ``message_id``."""
    return value[:8] + message_id.encode()


# -- spill ---------------------------------------------------------------------------------
SPILL_KEY = struct.Struct(">QQ")
SPILL_HEAD = struct.Struct(">IIQ")  # source subqueue, fairness key id, visible_at µs


class Spilled(NamedTuple):
    """A spill entry's value: where the message came from and its row value."""

    source: int
    kid: int
    visible_us: int
    value: bytes


def spill_name(type_: str, tenant: str) -> str:
    """The key name whose id heads a flooder's spill entries (never a fairness key)."""
    return f"\x00spill\x00{type_}\x00{tenant}"


def spill_key(spill_kid: int, seq: int) -> bytes:
    return SPILL_KEY.pack(spill_kid, seq)


def spill_seq(key: bytes) -> int:
    return SPILL_KEY.unpack(key)[1]


def spill_range(spill_kid: int) -> tuple[bytes, bytes]:
    return SPILL_KEY.pack(spill_kid, 0), SPILL_KEY.pack(spill_kid + 1, 0)


def key_after(key: bytes) -> bytes:
    """The first key after ``key`` (a scan resumes there)."""
    return key + b"\x00"


def spill_value(source: int, kid: int, visible_us: int, value: bytes) -> bytes:
    return SPILL_HEAD.pack(source, kid, visible_us) + value


def parse_spilled(stored: bytes) -> Spilled:
    return Spilled(*SPILL_HEAD.unpack_from(stored), stored[SPILL_HEAD.size:])


def spill_source(stored: bytes) -> int:
    return SPILL_HEAD.unpack_from(stored)[0]


def dequeue_count(value: bytes) -> int:
    """A row's dequeue count, read without the rest of its header."""
    return DEQUEUE.unpack_from(value, 16)[0]


# -- replica state (meta) --------------------------------------------------------------
# A follower's durable epoch and the sequence number of the last write set it applied
# (docs/replication.md); a promoted follower's leader continues from them.
REPLICA_KEY = b"replica:"
_REPLICA = struct.Struct(">QQ")


def replica_state(epoch: int, seq: int) -> bytes:
    return _REPLICA.pack(epoch, seq)


def read_replica_state(value: bytes | None) -> tuple[int, int]:
    """(epoch, last applied sequence); (0, 0) for a store that never was a replica."""
    return _REPLICA.unpack(value) if value else (0, 0)


# -- tasks by id ---------------------------------------------------------------------------
_ID_SEP = b"\x00"  # names and ids are printable: NUL never occurs in them
_TASK_RECORD = struct.Struct(">QQQIQ")  # expires, enqueued, ended µs, attempts, first received µs


class TaskRecord(NamedTuple):
    """A task's entry in ``tasks``; the µs fields are 0 until they happened."""

    expires_us: int
    enqueued_us: int
    ended_us: int
    attempts: int
    first_received_us: int
    account: str
    task_id: str
    tenant: str
    type: str

    def pack(self) -> bytes:
        names = (self.account, self.task_id, self.tenant, self.type)
        return _TASK_RECORD.pack(*self[:5]) + _ID_SEP.join(n.encode() for n in names)

    @classmethod
    def unpack(cls, value: bytes) -> "TaskRecord":
        names = value[_TASK_RECORD.size:].decode().split("\x00")
        return cls(*_TASK_RECORD.unpack_from(value), *names)


def task_id_key(account: str, task_id: str) -> bytes:
    return account.encode() + _ID_SEP + task_id.encode()


task_seq_key = _U64.pack  # seq -> a ``tasks`` key (and a ``task_ids`` value)


def usage_key(now_us: int) -> bytes:
    """A ``usage`` key: its time first (taken oldest first), then random bytes (two
    reports of one µs)."""
    return _U64.pack(now_us) + os.urandom(6)
