"""Client-side group commit: concurrent sends through one transport share one durable put.

No Ray here: the flush function is handed in (the transport's put call). Each
:class:`~rayq.transport.Transport` owns its coalescers, so a send is signed by
the client that makes it, with that client's key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rayq.core.model import NewMessage


class _Slot:
    __slots__ = ("messages", "done", "result", "error")

    def __init__(self, messages: list[NewMessage]):
        self.messages, self.done = messages, threading.Event()
        self.result: list | None = None
        self.error: BaseException | None = None


class SendCoalescer:
    """Client-side group commit: concurrent sends from threads of one process share
    put calls. A sender that finds fewer than ``max_in_flight`` flushes under way
    leads one, taking what is pending; the others wait. One in flight is the default:
    measured with 8 threads on 2 cores, it made the fewest, largest puts (4 messages a
    call, 196 µs of client CPU a message) and the most messages a second (898, beside
    787 with two in flight and 860 with four). Each caller still returns only after
    its own messages are durable."""

    def __init__(self, max_messages: int = 1000, max_in_flight: int = 1):
        self._max, self._max_in_flight = max_messages, max_in_flight
        self._lock = threading.Lock()
        self._pending: list[_Slot] = []
        self._leaders = 0

    def send(self, messages: list[NewMessage], flush: Callable[[list[NewMessage]], list]) -> list:
        """Put ``messages`` (with whatever else is pending) through ``flush``, a call that
        stores a list durably and returns a result per message; returns this caller's
        results. Every caller of one coalescer passes an equivalent ``flush`` (the owner's
        put call): whoever leads a flush uses its own, and none is kept, so a coalescer
        holds no reference back to its owner."""
        slot = _Slot(messages)
        with self._lock:
            self._pending.append(slot)
            leader = self._leaders < self._max_in_flight
            self._leaders += leader
        if leader:
            self._drain(flush)
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.result

    def _drain(self, flush: Callable[[list[NewMessage]], list]) -> None:
        while True:
            with self._lock:
                batch, size = [], 0
                while self._pending and (not batch or size + len(self._pending[0].messages) <= self._max):
                    slot = self._pending.pop(0)
                    batch.append(slot)
                    size += len(slot.messages)
                if not batch:
                    self._leaders -= 1
                    return
            try:
                ids = flush([m for slot in batch for m in slot.messages])
                offset = 0
                for slot in batch:
                    slot.result = ids[offset:offset + len(slot.messages)]
                    offset += len(slot.messages)
            except BaseException as err:  # every sender of this flush learns of the failure
                for slot in batch:
                    slot.error = err
            for slot in batch:
                slot.done.set()
