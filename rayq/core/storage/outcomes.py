"""How task messages end: a write batch records each task's outcome durably, once.

The ``outcomes`` table maps a message id to its ending and payload, with its own
expiry index; ``wait_outcome`` (the ObjectRef of ``client.submit``) reads it.
:class:`OutcomeOps` holds these operations; :class:`~rayq.core.storage.batch.WriteBatch` has
them as its own.
"""

from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING, NamedTuple

from rayq.core.codec.model import ROW_KEY, Ending, check_subqueue, to_us
from rayq.errors import InvalidMessage

if TYPE_CHECKING:
    from rayq.core.storage.batch import WriteBatch

U64 = struct.Struct(">Q")
MAX_OUTCOME_BYTES = 16 << 20


class Outcome(NamedTuple):
    """How a task message ended (recorded in this transaction)."""

    message_id: str
    ending: Ending
    payload: bytes


class OutcomeOps:
    """Ending task messages with an outcome, as operations of a write batch."""

    def finish(self: "WriteBatch", receipt: str, outcome: bytes,
               dead_letter: int | None = None) -> None:
        """End a received task: record ``outcome`` and delete the message, or move it
        to subqueue ``dead_letter`` (a task that failed for the last time).
        Raises ReceiptInvalid when the receipt is stale: someone else owns it now."""
        if not isinstance(outcome, bytes) or len(outcome) > MAX_OUTCOME_BYTES:
            raise InvalidMessage(f"an outcome is at most {MAX_OUTCOME_BYTES} bytes")
        if dead_letter is not None:
            check_subqueue(dead_letter)
        row_key, value = self._resolve(receipt)
        if dead_letter is None:
            self._remove(row_key, value)
            self.stats["deletes"] += 1
        else:
            self._dead_letter(row_key, value, dead_letter, record=False)
        self.record(self.message_id(ROW_KEY.unpack(row_key)[3]), Ending.RESULT, outcome)

    def record(self: "WriteBatch", message_id: str, ending: Ending, payload: bytes = b"") -> None:
        expires_us = self.now_us + to_us(self.config.outcome_ttl_s)
        mid = message_id.encode()
        if self.txn.get("outcomes", mid) is not None:
            return  # a task ends once: deleting its dead letter later changes nothing
        self.txn.put("outcomes", mid, U64.pack(expires_us) + bytes([ending.value]) + payload)
        self.txn.put("outcome_expiry", U64.pack(expires_us) + mid, b"")
        self.outcomes.append(Outcome(message_id, ending, payload))

    def _collect_outcomes(self: "WriteBatch", limit: int) -> int:
        stop = U64.pack(self.now_us + 1)
        entries = [key for key, _ in itertools.islice(self.txn.scan("outcome_expiry", b"", stop), limit)]
        for key in entries:
            self.txn.delete("outcome_expiry", key)
            value = self.txn.get("outcomes", key[8:])
            if value is not None and value[:8] == key[:8]:
                self.txn.delete("outcomes", key[8:])
        return len(entries)
