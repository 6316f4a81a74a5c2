"""How task messages end, and tasks by id.

Each task's outcome is recorded durably, once: the ``outcomes`` table maps a message id
to its ending and payload, with its own expiry index; the outcome desks (the ObjectRefs
of ``client.submit``) read it. :meth:`Ledger.record
<rayq.core.storage.ledger.Ledger.record>` writes an outcome; these are the operations
around it.

Every task message carries an id of its submitter's choosing (a client draws a random
one when the caller chose none). The put that stores the task writes two entries
beside its row (tables in :mod:`rayq.core.storage.layout`):

- ``task_ids``: (account, task id) -> the task's seq. A second put of the same id by
  the same account finds it and stores nothing: it returns the first task's message id
  (idempotent submit), for as long as the task's outcome is kept.
- ``tasks``: seq -> :class:`~rayq.core.storage.layout.TaskRecord`: what a lookup shows
  of a task whose row has gone (ended, or spilled by flood isolation), and the way to
  its row while it has one (its expiry entry, keyed by expiry and seq, gives the row's
  current key).

The transaction that records a task's outcome stamps its record with when it ended, its
deliveries and when it first started; the one that drops the outcome drops both entries.
Accounts see their own ids only: the key starts with the account's name.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from rayq.core.codec.model import US, Ending, at_s, check_count, check_subqueue, seq_of
from rayq.core.codec.task_ids import TaskInfo, TaskState, task_state
from rayq.core.kit.kv import Txn
from rayq.core.storage import layout
from rayq.core.storage.ledger import Env, Ledger, Outcome
from rayq.core.storage.spill import drop_spilled
from rayq.errors import InvalidMessage

MAX_USAGE_BYTES = 4096  # one packed usage report


def finish(w: Ledger, env: Env, receipt: str, outcome: bytes,
           dead_letter: int | None = None, usage: bytes | None = None) -> None:
    """End a received task: record ``outcome`` and delete the message, or move it
    to subqueue ``dead_letter`` (a task that failed for the last time); ``usage``: the
    delivery's report, kept with its end (:func:`record_usage`).
    Raises ReceiptInvalid when the receipt is stale: someone else owns it now (nothing
    is recorded then, the report neither)."""
    # its limit is a task body's: the tag byte of a values body is not counted
    if not isinstance(outcome, bytes) or len(outcome) > env.config.max_task_bytes + 1:
        raise InvalidMessage(f"an outcome is at most {env.config.max_task_bytes} bytes "
                             f"(StoreConfig.max_task_bytes)")
    if dead_letter is not None:
        check_subqueue(dead_letter)
    row_key, value = w.resolve(receipt)
    # cancelled while it ran: that is its end, whatever its consumer made of it
    if not end_cancelled(w, row_key, value):
        if dead_letter is None:
            w.remove(row_key, value)
            w.stats["deletes"] += 1
        else:
            dead_letter_row(w, row_key, value, dead_letter, record=False)
        w.record(layout.parse_row_key(row_key)[3], Ending.RESULT, outcome, value)
    if usage is not None:
        record_usage(w, env, usage)


def dead_letter_row(w: Ledger, row_key: bytes, value: bytes, dead_letter: int,
                    record: bool = True) -> None:
    """Move a row to subqueue ``dead_letter``, visible now; a task ends as Dead unless
    ``record`` is off (its outcome is recorded by the caller)."""
    meta = w.move_to(row_key, value, dead_letter, w.now_us, used=True)
    w.stats["dead_lettered"] += 1
    if meta.flags & layout.TASK and record:
        w.record(layout.parse_row_key(row_key)[3], Ending.DEAD, value=value)


def end_cancelled(w: Ledger, row_key: bytes, value: bytes) -> bool:
    """End a task row flagged CANCELLING (cancelled while a consumer held it) as
    cancelled: deleted, its ending recorded. False, and nothing done, for any other row."""
    if not layout.flags_of(value) & layout.CANCELLING:
        return False
    w.remove(row_key, value, Ending.CANCELLED)
    return True


def record_usage(w: Ledger, env: Env, report: bytes) -> None:
    """Keep a delivery's usage report (opaque bytes, packed by its consumer) until the
    coordinator takes it; sent with the delivery's end, so it is stored with it."""
    if not isinstance(report, bytes) or not 0 < len(report) <= MAX_USAGE_BYTES:
        raise InvalidMessage(f"a usage report is 1 to {MAX_USAGE_BYTES} bytes")
    w.txn.put("usage", layout.usage_key(w.now_us), report)


def take_usage(w: Ledger, env: Env, limit: int) -> list[bytes]:
    """Remove and return up to ``limit`` usage reports, oldest first."""
    check_count(limit, "limit", 1, 100_000)
    taken = list(itertools.islice(w.txn.scan("usage", b""), limit))
    for key, _ in taken:
        w.txn.delete("usage", key)
    return [report for _, report in taken]


def collect_outcomes(w: Ledger, limit: int) -> int:
    """Drop up to ``limit`` outcomes past their time; returns how many entries went."""
    stop = layout.outcome_expiry_stop(w.now_us)
    entries = list(itertools.islice(w.txn.scan_keys("outcome_expiry", b"", stop), limit))
    for key in entries:
        w.txn.delete("outcome_expiry", key)
        value = w.txn.get("outcomes", layout.outcome_of_expiry(key))
        if value is not None and layout.outcome_expires_with(value, key):
            w.txn.delete("outcomes", layout.outcome_of_expiry(key))
            forget(w.txn, seq_of(layout.outcome_of_expiry(key).decode()))
    return len(entries)


def read_outcomes(txn: Txn, message_ids: Sequence[str]) -> list[tuple[Ending, bytes] | None]:
    """How each task ended, or None while it has not (or its outcome expired)."""
    values = [txn.get("outcomes", layout.outcome_key(mid)) for mid in message_ids]
    return [None if value is None else layout.parse_outcome(value) for value in values]


# -- tasks by id ---------------------------------------------------------------------------
def existing(txn: Txn, account: str, task_id: str) -> int | None:
    """The seq of the task ``account`` submitted as ``task_id``, if it is still kept."""
    found = txn.get("task_ids", layout.task_id_key(account, task_id))
    return None if found is None else layout.unpack_u64(found)


def forget(txn: Txn, seq: int) -> None:
    """Drop both entries of task ``seq`` (its outcome expired)."""
    key = layout.task_seq_key(seq)
    found = txn.get("tasks", key)
    if found is None:
        return
    record = layout.TaskRecord.unpack(found)
    txn.delete("tasks", key)
    id_entry = layout.task_id_key(record.account, record.task_id)
    if txn.get("task_ids", id_entry) == key:
        txn.delete("task_ids", id_entry)


def ends(txn: Txn, message_ids: Sequence[str], store_hex: str) -> list[tuple | None | bool]:
    """How each task ended: its (ending, payload); None while it has not; False when this
    store keeps neither the task nor an outcome (its only copies are lost, or it is not
    a task of this store)."""
    out: list[tuple | None | bool] = []
    for mid in message_ids:
        value = txn.get("outcomes", layout.outcome_key(mid))
        if value is not None:
            out.append(layout.parse_outcome(value))
        else:
            out.append(None if _kept(txn, mid, store_hex) else False)
    return out


def _kept(txn: Txn, message_id: str, store_hex: str) -> bool:
    """Whether this store keeps a record of the task ``message_id`` names."""
    if not message_id.startswith(store_hex + "-"):
        return False
    try:
        seq = seq_of(message_id)
    except (IndexError, ValueError):
        return False
    return 0 <= seq < 2**64 and txn.get("tasks", layout.task_seq_key(seq)) is not None


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
        found = txn.get("tasks", layout.task_seq_key(seq)) if seq is not None else None
        if found is None:
            out.append(None)
            continue
        mid = message_id(seq)
        out.append(FoundTask(mid, _info(txn, layout.TaskRecord.unpack(found), seq, mid, now_us)))
    return out


def _info(txn: Txn, record: layout.TaskRecord, seq: int, mid: str, now_us: int) -> TaskInfo:
    outcome = txn.get("outcomes", layout.outcome_key(mid))
    if outcome is not None:
        ending, payload = layout.parse_outcome(outcome)
        state = task_state(ending, payload, running=False)
        return _made(record, state, record.attempts, record.first_received_us,
                     record.ended_us)
    attempts, first_us, running = _row_now(txn, record, seq, now_us)
    return _made(record, task_state(None, b"", running), attempts, first_us, 0)


def _row_now(txn: Txn, record: layout.TaskRecord, seq: int, now_us: int) -> tuple[int, int, bool]:
    """(deliveries, first received µs, whether it runs now) of a task with no outcome,
    read from its row; a row not found (spilled: waiting to be swept back) is queued."""
    row_key = txn.get("expiry", layout.expiry_key(record.expires_us, seq))
    value = txn.get("rows", row_key) if row_key is not None else None
    if value is None:
        return 0, 0, False
    meta = layout.meta(value)
    sq, kid, visible_us, _ = layout.parse_row_key(row_key)
    hidden_until = txn.get("inflight", layout.inflight_key(sq, kid, seq))
    if hidden_until is not None:
        visible_us = layout.unpack_u64(hidden_until)
    running = meta.dequeue_count > 0 and visible_us > now_us and not meta.flags & layout.RESTING
    return meta.dequeue_count, meta.first_received_us, running


def _made(record: layout.TaskRecord, state: TaskState, attempts: int, first_us: int,
          ended_us: int) -> TaskInfo:
    return TaskInfo(record.task_id, record.type, record.tenant, state, attempts,
                    record.enqueued_us / US, at_s(first_us), at_s(ended_us))


def revive(w: Ledger, seq: int) -> None:
    """Forget the recorded end of task ``seq`` in the transaction that puts its row back
    in its queue (a redrive): its id finds it queued again with no deliveries, the
    ``task_ids`` entry still points at it, and its next end is recorded anew. The desks
    hear of it in the ends' order (an ending None): one told the old end forgets it."""
    message_id = w.message_id(seq)
    key = layout.outcome_key(message_id)
    found = w.txn.get("outcomes", key)
    if found is not None:
        w.txn.delete("outcomes", key)
        w.txn.delete("outcome_expiry", layout.outcome_expiry_of(found, message_id))
    record = w.txn.get("tasks", layout.task_seq_key(seq))
    if record is not None:
        fresh = layout.TaskRecord.unpack(record)._replace(ended_us=0, attempts=0,
                                                          first_received_us=0)
        w.txn.put("tasks", layout.task_seq_key(seq), fresh.pack())
    w.outcomes.append(Outcome(message_id, None, b""))


def index_task(w: Ledger, seq: int, record: layout.TaskRecord) -> None:
    """Write a new task's two entries (in the put that stores its row)."""
    w.txn.put("task_ids", layout.task_id_key(record.account, record.task_id), layout.task_seq_key(seq))
    w.txn.put("tasks", layout.task_seq_key(seq), record.pack())


# -- cancelling ------------------------------------------------------------------------------
class CancelResult(str, Enum):
    """What :func:`cancel` did."""

    CANCELLED = "cancelled"  # it had not started (or waited for a retry): ended now
    RUNNING = "running"      # a consumer holds it: flagged, its consumer ends it cancelled
    ENDED = "ended"          # it had ended already: nothing done


def cancel(w: Ledger, env: Env, account: str, task_id: str) -> CancelResult | None:
    """Cancel task ``task_id`` of ``account``; None when this store keeps no such task.

    A task no consumer holds (queued, delayed, waiting for a retry, or spilled by flood
    isolation) ends now, cancelled: its row deleted and its ending recorded in this
    transaction. A running one is flagged CANCELLING (once): its consumer learns of it
    from its next heartbeat (:func:`rayq.core.storage.messages.extend`) and whatever
    end it makes records the task as cancelled; if that consumer is gone, the receive
    that finds the row again ends it so."""
    seq = existing(w.txn, account, task_id)
    found = w.txn.get("tasks", layout.task_seq_key(seq)) if seq is not None else None
    if found is None:
        return None
    if w.txn.get("outcomes", layout.outcome_key(w.message_id(seq))) is not None:
        return CancelResult.ENDED
    record = layout.TaskRecord.unpack(found)
    row_key = w.txn.get("expiry", layout.expiry_key(record.expires_us, seq))
    value = w.txn.get("rows", row_key) if row_key is not None else None
    if value is None:
        return _cancel_spilled(w, record, seq)
    _, _, running = _row_now(w.txn, record, seq, w.now_us)
    if not running:
        w.remove(row_key, value, Ending.CANCELLED)
        return CancelResult.CANCELLED
    flags = layout.flags_of(value)
    if not flags & layout.CANCELLING:
        w.txn.put("rows", row_key, layout.with_flags(value, flags | layout.CANCELLING))
        w.uncached.append(row_key)
    return CancelResult.RUNNING


def _cancel_spilled(w: Ledger, record: layout.TaskRecord, seq: int) -> CancelResult:
    """Cancel a task whose row is in the spill store (a flooder's, waiting to be swept
    back): its entry dropped, its ending recorded. A task found nowhere has gone
    without an outcome kept: ENDED."""
    kid = w.key_id(layout.spill_name(record.type, record.tenant), create=False)
    key = layout.spill_key(kid, seq) if kid is not None else None
    stored = w.txn.get("spill", key) if key is not None else None
    if stored is None:
        return CancelResult.ENDED
    drop_spilled(w, key, stored, Ending.CANCELLED)
    return CancelResult.CANCELLED
