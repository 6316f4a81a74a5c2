"""Tasks by id: the id a task was submitted under, and what it is doing now.

Every task message carries an id of its submitter's choosing (a client draws a random
one when the caller chose none). The put that stores the task writes two entries
beside its row (tables in :mod:`rayq.core.storage.layout`):

- ``task_ids``: (account, task id) -> the task's seq. A second put of the same id by
  the same account finds it and stores nothing: it returns the first task's message id
  (idempotent submit), for as long as the task's outcome is kept.
- ``tasks``: seq -> :class:`TaskRecord`: what a lookup shows of a task whose row has
  gone (ended, or spilled by flood isolation), and the way to its row while it has one
  (its expiry entry, keyed by expiry and seq, gives the row's current key).

The transaction that records a task's outcome stamps its record with when it ended,
its deliveries and when it first started; the one that drops the outcome drops both
entries. Accounts see their own ids only: the key starts with the account's name.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from rayq.core.codec.model import US, at_s
from rayq.core.codec.task_ids import TaskInfo, TaskState, task_state
from rayq.core.kit.kv import Txn
from rayq.core.storage import layout as rows

if TYPE_CHECKING:
    from rayq.core.storage.ledger import Ledger

_SEP = b"\x00"  # names and ids are printable: NUL never occurs in them
_RECORD = struct.Struct(">QQQIQ")  # expires µs, enqueued µs, ended µs, attempts, first received µs
_SEQ = struct.Struct(">Q")


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
        return _RECORD.pack(*self[:5]) + _SEP.join(n.encode() for n in names)

    @classmethod
    def unpack(cls, value: bytes) -> "TaskRecord":
        names = value[_RECORD.size:].decode().split("\x00")
        return cls(*_RECORD.unpack_from(value), *names)


def id_key(account: str, task_id: str) -> bytes:
    return account.encode() + _SEP + task_id.encode()


def seq_key(seq: int) -> bytes:
    return _SEQ.pack(seq)


def existing(txn: Txn, account: str, task_id: str) -> int | None:
    """The seq of the task ``account`` submitted as ``task_id``, if it is still kept."""
    found = txn.get("task_ids", id_key(account, task_id))
    return None if found is None else _SEQ.unpack(found)[0]


def index(w: Ledger, seq: int, record: TaskRecord) -> None:
    """Write a new task's two entries (in the put that stores its row)."""
    w.txn.put("task_ids", id_key(record.account, record.task_id), seq_key(seq))
    w.txn.put("tasks", seq_key(seq), record.pack())


def ended(w: Ledger, seq: int, value: bytes | None) -> None:
    """Stamp the record of task ``seq`` (its row's last value, if the caller has it)
    with the end recorded now."""
    found = w.txn.get("tasks", seq_key(seq))
    if found is None:
        return  # a task stored before tasks had ids
    record = TaskRecord.unpack(found)
    if value is not None:
        meta = rows.meta(value)
        record = record._replace(attempts=meta.dequeue_count,
                                 first_received_us=meta.first_received_us)
    w.txn.put("tasks", seq_key(seq), record._replace(ended_us=w.now_us).pack())


def forget(txn: Txn, seq: int) -> None:
    """Drop both entries of task ``seq`` (its outcome expired)."""
    key = seq_key(seq)
    found = txn.get("tasks", key)
    if found is None:
        return
    record = TaskRecord.unpack(found)
    txn.delete("tasks", key)
    id_entry = id_key(record.account, record.task_id)
    if txn.get("task_ids", id_entry) == key:
        txn.delete("task_ids", id_entry)


class FoundTask(NamedTuple):
    """A task a lookup found: its message id (what its outcome is waited for by) and
    what it is doing."""

    message_id: str
    info: TaskInfo


def look_up(txn: Txn, account: str, task_ids: Sequence[str], now_us: int,
            message_id) -> list[FoundTask | None]:
    """Each task ``account`` submitted under these ids, or None for one this store does
    not keep. ``message_id(seq)`` names a task's message."""
    out = []
    for task_id in task_ids:
        seq = existing(txn, account, task_id)
        found = txn.get("tasks", seq_key(seq)) if seq is not None else None
        if found is None:
            out.append(None)
            continue
        mid = message_id(seq)
        out.append(FoundTask(mid, _info(txn, TaskRecord.unpack(found), seq, mid, now_us)))
    return out


def _info(txn: Txn, record: TaskRecord, seq: int, mid: str, now_us: int) -> TaskInfo:
    outcome = txn.get("outcomes", rows.outcome_key(mid))
    if outcome is not None:
        ending, payload = rows.parse_outcome(outcome)
        state = task_state(ending, payload, running=False)
        return _made(record, state, record.attempts, record.first_received_us,
                     record.ended_us)
    attempts, first_us, running = _row_now(txn, record, seq, now_us)
    return _made(record, task_state(None, b"", running), attempts, first_us, 0)


def _row_now(txn: Txn, record: TaskRecord, seq: int, now_us: int) -> tuple[int, int, bool]:
    """(deliveries, first received µs, whether it runs now) of a task with no outcome,
    read from its row; a row not found (spilled: waiting to be swept back) is queued."""
    row_key = txn.get("expiry", rows.expiry_key(record.expires_us, seq))
    value = txn.get("rows", row_key) if row_key is not None else None
    if value is None:
        return 0, 0, False
    meta = rows.meta(value)
    sq, kid, visible_us, _ = rows.parse_row_key(row_key)
    hidden_until = txn.get("inflight", rows.inflight_key(sq, kid, seq))
    if hidden_until is not None:
        visible_us = rows.unpack_u64(hidden_until)
    running = meta.dequeue_count > 0 and visible_us > now_us
    return meta.dequeue_count, meta.first_received_us, running


def _made(record: TaskRecord, state: TaskState, attempts: int, first_us: int,
          ended_us: int) -> TaskInfo:
    return TaskInfo(record.task_id, record.type, record.tenant, state, attempts,
                    record.enqueued_us / US, at_s(first_us), at_s(ended_us))
