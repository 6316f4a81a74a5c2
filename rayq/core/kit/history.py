"""A bounded, persisted history of decisions: the newest ``limit`` records of a KV.

The fairness coordinator and the flood detector append every decision here;
``client.fairness()`` and ``client.flooders()`` read it back, and it survives
restarts. (The Parquet event log for analytics is fed from the same records.)
"""

from __future__ import annotations

import struct
from collections import deque

from rayq.core.kit.kv import KV
from rayq.core.codec.model import pack, unpack

_SEQ = struct.Struct(">Q")
PREFIX = b"ev:"


class EventHistory:
    def __init__(self, kv: KV, limit: int):
        self.kv, self.limit = kv, limit
        self.events: deque[dict] = deque(kv.read(self._load), maxlen=limit)
        self._seq = self.events[-1]["seq"] if self.events else 0

    def _load(self, txn) -> list[dict]:
        return [unpack(v) for _, v in txn.scan("meta", PREFIX, PREFIX[:-1] + b";")][-self.limit:]

    def append(self, event: dict) -> dict:
        """Persist an event (a plain msgpack-able dict) with the next sequence number."""
        self._seq += 1
        event = {**event, "seq": self._seq}
        oldest = self._seq - self.limit

        def write(txn):
            txn.put("meta", PREFIX + _SEQ.pack(self._seq), pack(event))
            if oldest > 0:
                txn.delete("meta", PREFIX + _SEQ.pack(oldest))
        self.kv.transact(write)
        self.events.append(event)
        return event

    def recent(self) -> tuple[dict, ...]:
        return tuple(self.events)
