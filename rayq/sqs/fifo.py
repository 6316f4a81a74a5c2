"""FIFO queues: what a send must carry, deduplication and sequence numbers.

SQS drops a FIFO message whose deduplication id was sent to the queue (or, with
``DeduplicationScope=messageGroup``, to its group) in the last 5 minutes, answering
with the first message's id and sequence number. :class:`Dedup` keeps those ids and
each queue's sequence counter in a KV (the endpoint's state actor's LMDB, fsync'd),
so they survive any restart. An id is reserved when its send is admitted, before the
message is stored: a second send of it meanwhile (a retry through another replica)
waits for the first one's answer rather than storing the message twice. Pure: time is
passed in.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from typing import Any

from rayq.core.codec.model import pack, unpack
from rayq.core.kit.kv import KV, Txn
from rayq.sqs.errors import invalid, missing, out_of_range

WINDOW_S = 300.0
# A reservation whose send neither stored nor released it within this long (its replica
# died) no longer holds its id: a send is answered well within it.
RESERVED_S = 60.0
_DEDUP_ID = re.compile(r"^[!-~]{1,128}$")
_TABLE = "meta"
_SEQ = struct.Struct(">Q")


@dataclass(frozen=True)
class Admitted:
    """A FIFO send as :meth:`Dedup.admit` answers it: its sequence number and, for a
    duplicate, the id of the message first sent with its deduplication id. ``waiting``:
    another send holds the id and has not stored its message yet (ask again)."""

    sequence: str
    duplicate_of: str | None = None
    waiting: bool = False


def dedup_id(entry: dict, body: str, content_based: bool) -> str:
    """A FIFO send's MessageDeduplicationId (the body's SHA-256 with content-based
    deduplication). Raises MissingParameter or InvalidParameterValue."""
    given = entry.get("MessageDeduplicationId")
    if given is None:
        if not content_based:
            raise invalid("The queue should either have ContentBasedDeduplication enabled or "
                          "MessageDeduplicationId provided explicitly")
        return hashlib.sha256(body.encode()).hexdigest()
    if not isinstance(given, str) or not _DEDUP_ID.match(given):
        raise out_of_range("MessageDeduplicationId", given, "MessageDeduplicationId can only "
                           "include alphanumeric and punctuation characters. 1 to 128 in "
                           "length.")
    return given


def check_send(entry: dict) -> None:
    """What a FIFO send must (MessageGroupId) and must not (DelaySeconds) carry."""
    if entry.get("MessageGroupId") is None:
        raise missing("MessageGroupId")
    if entry.get("DelaySeconds") not in (None, 0):
        raise out_of_range("DelaySeconds", entry["DelaySeconds"], "The request include "
                           "parameter that is not valid for this queue type.")


def scope_key(dedup: str, group: str, per_group: bool) -> str:
    """The key a deduplication id is unique under: the queue, or its group."""
    return f"{group}\x00{dedup}" if per_group else dedup


class Dedup:
    """Deduplication ids of the last :data:`WINDOW_S` and sequence counters, per queue."""

    def __init__(self, kv: KV):
        self.kv = kv

    def admit(self, queue: str, keys: list[str], now: float) -> list[Admitted]:
        """For each send (by its scope key, in order): a new sequence number, its key
        reserved until :meth:`record` or :meth:`release`; or what the first send of that
        key within the window got (``waiting`` while that send holds it unrecorded). A key
        repeated in ``keys`` is a duplicate of its first occurrence (``duplicate_of`` ""
        until it is recorded)."""
        return self.kv.transact(lambda txn: self._admit(txn, queue, keys, now))

    def _admit(self, txn: Txn, queue: str, keys: list[str], now: float) -> list[Admitted]:
        counter_key = _key(b"seq", queue)
        raw = txn.get(_TABLE, counter_key)
        counter = _SEQ.unpack(raw)[0] if raw else 0
        out: list[Admitted] = []
        fresh: dict[str, str] = {}
        for key in keys:
            seen = txn.get(_TABLE, _key(b"dedup", queue, key))
            record = unpack(seen) if seen else None
            if key in fresh:
                out.append(Admitted(fresh[key], ""))
            elif record and record["id"] is None and now - record["at"] < RESERVED_S:
                out.append(Admitted(record["seq"], waiting=True))
            elif record and record["id"] is not None and now - record["at"] < WINDOW_S:
                out.append(Admitted(record["seq"], record["id"]))
            else:
                counter += 1
                fresh[key] = f"{counter:020d}"
                txn.put(_TABLE, _key(b"dedup", queue, key),
                        pack({"id": None, "seq": fresh[key], "at": now}))
                out.append(Admitted(fresh[key]))
        txn.put(_TABLE, counter_key, _SEQ.pack(counter))
        return out

    def record(self, queue: str, sent: list[tuple[str, str, str]], now: float) -> None:
        """Remember (scope key, message id, sequence number) of messages just stored."""
        def write(txn: Txn) -> None:
            for key, message_id, sequence in sent:
                txn.put(_TABLE, _key(b"dedup", queue, key),
                        pack({"id": message_id, "seq": sequence, "at": now}))
        self.kv.transact(write)

    def release(self, queue: str, keys: list[str]) -> None:
        """Free the reserved keys of a send that failed (recorded ones stay)."""
        def free(txn: Txn) -> None:
            for key in keys:
                seen = txn.get(_TABLE, _key(b"dedup", queue, key))
                if seen is not None and unpack(seen)["id"] is None:
                    txn.delete(_TABLE, _key(b"dedup", queue, key))
        self.kv.transact(free)

    def forget(self, queue: str, now: float) -> int:
        """Drop the queue's ids older than the window (all of them for a deleted queue,
        with ``now`` infinite); returns how many."""
        prefix = _key(b"dedup", queue, "")

        def sweep(txn: Txn) -> int:
            old = [k for k, v in txn.scan(_TABLE, prefix, prefix[:-1] + b"\x01")
                   if now - unpack(v)["at"] >= WINDOW_S]
            for k in old:
                txn.delete(_TABLE, k)
            return len(old)
        return self.kv.transact(sweep)


def _key(kind: bytes, queue: str, key: Any = None) -> bytes:
    out = b"fifo:" + kind + b":" + queue.encode() + b"\x00"
    return out if key is None else out + key.encode()
