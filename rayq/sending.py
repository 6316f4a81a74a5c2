"""Client-side group commit: concurrent sends of one process share one durable put.

No Ray here: the flush function is handed in (the client's put call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rayq.core.model import NewMessage


class _Slot:
    __slots__ = ("messages", "done", "result", "error")

    def __init__(self, messages: list[NewMessage]):
        self.messages, self.done = messages, threading.Event()
        self.result: list | None = None
        self.error: BaseException | None = None


class SendCoalescer:
    """Client-side group commit: concurrent sends from threads of one process share
    one put call. The first sender flushes what is pending while others wait; each
    caller still returns only after its own messages are durable."""

    def __init__(self, flush: Callable[[list[NewMessage]], list], max_messages: int = 1000):
        self._flush, self._max = flush, max_messages
        self._lock = threading.Lock()
        self._pending: list[_Slot] = []
        self._flushing = False

    def send(self, messages: list[NewMessage]) -> list:
        slot = _Slot(messages)
        with self._lock:
            self._pending.append(slot)
            leader = not self._flushing
            self._flushing = True
        if leader:
            self._drain()
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.result

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, size = [], 0
                while self._pending and (not batch or size + len(self._pending[0].messages) <= self._max):
                    slot = self._pending.pop(0)
                    batch.append(slot)
                    size += len(slot.messages)
                if not batch:
                    self._flushing = False
                    return
            try:
                ids = self._flush([m for slot in batch for m in slot.messages])
                offset = 0
                for slot in batch:
                    slot.result = ids[offset:offset + len(slot.messages)]
                    offset += len(slot.messages)
            except BaseException as err:  # every sender of this flush learns of the failure
                for slot in batch:
                    slot.error = err
            for slot in batch:
                slot.done.set()


# One coalescer per (runtime, queue) in this process: every client of the process
# shares it, so concurrent senders on any thread ride the same put call.
_SENDERS: dict[tuple[Any, str], SendCoalescer] = {}
_SENDERS_LOCK = threading.Lock()


def sender_for(runtime: str, name: str, flush) -> SendCoalescer:
    """The process-wide coalescer of queue ``name`` on runtime ``runtime`` (an id)."""
    key = (runtime, name)
    with _SENDERS_LOCK:
        sender = _SENDERS.get(key)
        if sender is None:
            sender = _SENDERS[key] = SendCoalescer(flush)
        return sender
