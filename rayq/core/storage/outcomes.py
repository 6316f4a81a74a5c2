"""How task messages end: each task's outcome is recorded durably, once.

The ``outcomes`` table maps a message id to its ending and payload, with its own
expiry index; ``wait_outcome`` (the ObjectRef of ``client.submit``) reads it.
:meth:`Ledger.record <rayq.core.storage.ledger.Ledger.record>` writes an outcome;
these are the operations around it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rayq.core.codec.model import Ending, check_subqueue, seq_of
from rayq.core.kit.kv import Txn
from rayq.core.storage import layout as rows, task_index
from rayq.core.storage.ledger import Env, Ledger
from rayq.errors import InvalidMessage

MAX_OUTCOME_BYTES = 16 << 20


def finish(w: Ledger, env: Env, receipt: str, outcome: bytes,
           dead_letter: int | None = None) -> None:
    """End a received task: record ``outcome`` and delete the message, or move it
    to subqueue ``dead_letter`` (a task that failed for the last time).
    Raises ReceiptInvalid when the receipt is stale: someone else owns it now."""
    if not isinstance(outcome, bytes) or len(outcome) > MAX_OUTCOME_BYTES:
        raise InvalidMessage(f"an outcome is at most {MAX_OUTCOME_BYTES} bytes")
    if dead_letter is not None:
        check_subqueue(dead_letter)
    row_key, value = w.resolve(receipt)
    if dead_letter is None:
        w.remove(row_key, value)
        w.stats["deletes"] += 1
    else:
        dead_letter_row(w, row_key, value, dead_letter, record=False)
    w.record(rows.parse_row_key(row_key)[3], Ending.RESULT, outcome, value)


def dead_letter_row(w: Ledger, row_key: bytes, value: bytes, dead_letter: int,
                    record: bool = True) -> None:
    """Move a row to subqueue ``dead_letter``, visible now; a task ends as Dead unless
    ``record`` is off (its outcome is recorded by the caller)."""
    meta = w.move_to(row_key, value, dead_letter, w.now_us, used=True)
    w.stats["dead_lettered"] += 1
    if meta.flags & rows.TASK and record:
        w.record(rows.parse_row_key(row_key)[3], Ending.DEAD, value=value)


def collect_outcomes(w: Ledger, limit: int) -> int:
    """Drop up to ``limit`` outcomes past their time; returns how many entries went."""
    stop = rows.outcome_expiry_stop(w.now_us)
    entries = list(itertools.islice(w.txn.scan_keys("outcome_expiry", b"", stop), limit))
    for key in entries:
        w.txn.delete("outcome_expiry", key)
        value = w.txn.get("outcomes", rows.outcome_of_expiry(key))
        if value is not None and rows.outcome_expires_with(value, key):
            w.txn.delete("outcomes", rows.outcome_of_expiry(key))
            task_index.forget(w.txn, seq_of(rows.outcome_of_expiry(key).decode()))
    return len(entries)


def read_outcomes(txn: Txn, message_ids: Sequence[str]) -> list[tuple[Ending, bytes] | None]:
    """How each task ended, or None while it has not (or its outcome expired)."""
    values = [txn.get("outcomes", rows.outcome_key(mid)) for mid in message_ids]
    return [None if value is None else rows.parse_outcome(value) for value in values]
