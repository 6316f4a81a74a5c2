"""Client-side group commit: concurrent sends through one transport share one durable put.

No Ray here: the flush function is handed in (the transport's put call). Each
:class:`~rayq.transport.Transport` owns its coalescers, so a send is signed by
the client that makes it, with that client's key.
"""

from __future__ import annotations

from collections.abc import Callable

from rayq.batching import ThreadBatcher
from rayq.core.kit.batcher import Batcher
from rayq.core.codec.model import NewMessage


class SendCoalescer(ThreadBatcher):
    """Client-side group commit: concurrent sends from threads of one process share
    put calls. A sender that finds fewer than ``max_in_flight`` flushes under way
    leads one, taking what is pending (whole sends, up to ``max_messages``); the others
    wait, and the lead then passes to the oldest of them (:class:`ThreadBatcher`).
    One in flight is the default: measured with 8 threads on 2 cores over the local
    channel, it made the largest puts and the most messages a second (2 846 and 3 056,
    beside 1 935 and 2 278 with two in flight, 1 791 and 2 220 with three). Each caller
    still returns only after its own messages are durable."""

    def __init__(self, max_messages: int = 1000, max_in_flight: int = 1):
        super().__init__(Batcher(max_items=max_messages, max_in_flight=max_in_flight,
                                 sized=True, name="send coalescer"))

    def send(self, messages: list[NewMessage], flush: Callable[[list[NewMessage]], list]) -> list:
        """Put ``messages`` (with whatever else is pending) through ``flush``, a call that
        stores a list durably and returns a result per message; returns this caller's
        results (see :meth:`ThreadBatcher.call`)."""
        return self.call(messages, flush)
