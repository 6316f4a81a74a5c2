"""Queue: one virtual queue's operations, over its client's transport.

The data path goes straight from the client to the shard actors; the manager
is asked only for routing (cached by the transport for a moment). Sends go
through the transport's producer of the queue (:mod:`rayq.sending`). A
transport is one producer session: its puts to a queue stick to one subqueue, and
each sending thread's to one subqueue of its own lane once it sends large batches
(enqueuer affinity, docs/shards-and-storage.md), so they stay in order.
"""

from __future__ import annotations

import asyncio

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rayq.core.auth.accounts import ADMIN
from rayq.core.auth.operations import MANAGER_OPS, SHARD_OPS
from rayq.core.codec.model import (DLQ_SUFFIX, MAX_BATCH, Outgoing, Received, check_count,
                                   check_seconds, receipt_subqueue)
from rayq.core.codec.wire import decode_received
from rayq.core.control.registry import QueueInfo, QueueMetadata
from rayq.errors import InvalidMessage, QueueDisabled, RayqError, ReceiptInvalid
from rayq.remote import call_all
from rayq.steps import Request, Steps
from rayq.transport import Transport

if TYPE_CHECKING:
    from rayq.sending import Producer

MAX_WAIT_S = 20.0
PARK_SLICE_S = 2.0  # a long poll over several shards looks at each again this often
MAX_RECEIVE = 1000


@dataclass(frozen=True)
class KeyStats:
    depth: int
    oldest_age_s: float


@dataclass(frozen=True)
class QueueStats:
    """A queue's depth (approximate), per-key depth and oldest age, subqueues and shard caches."""

    name: str
    depth: int
    dead_letter_depth: int
    subqueues: tuple[dict, ...]
    keys: dict[str, KeyStats] = field(default_factory=dict)
    shards: tuple[dict, ...] = ()


class Queue:
    """One virtual queue. All methods are blocking calls to the runtime. ``name`` is as
    its account says it (``account/name`` when the admin reaches another account's)."""

    def __init__(self, transport: Transport, name: str):
        self._transport = transport
        self.name = name

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- sending ----------------------------------------------------------------------
    @cached_property
    def _producer(self) -> Producer:
        """The transport's producer of this queue, which checks, encodes and puts sends:
        looked up on the first send (a queue only received from, or a name an SQS request
        names, makes none)."""
        return self._transport.producer(self.name)

    def send(self, body: Any, tenant: str | None = None, type: str = "default",
             delay_s: float = 0, ttl_s: float | None = None, priority: int = 0) -> str:
        """Store one message durably (fsync'd before this returns); returns its id.
        ``tenant`` defaults to the client's account (a signed client sends only as it).
        ``priority`` (0 to 9): among its fairness key's visible messages, a higher one is
        received first; between keys, fairness decides (an ordered queue takes none)."""
        producer = self._producer
        return producer.put([producer.message(body, tenant, type, delay_s, ttl_s,
                                              priority=priority)])[0][0]

    def send_batch(self, messages: Sequence[Outgoing]) -> list[str]:
        """Store up to 1000 messages in one durable transaction; returns their ids in order."""
        return [mid for mid, _ in self._producer.put(self._entries(messages))]

    async def send_batch_async(self, messages: Sequence[Outgoing]) -> list[str]:
        """:meth:`send_batch` awaited on an event loop (the SQS endpoint's): a put of its
        own, not shared with other senders of this client."""
        return [mid for mid, _ in await self._producer.put_async(self._entries(messages))]

    def _entries(self, messages: Sequence[Outgoing]) -> list:
        """``messages`` checked and encoded, as the producer puts them."""
        if not isinstance(messages, (list, tuple)) or not 1 <= len(messages) <= MAX_BATCH:
            raise InvalidMessage(f"send_batch takes a list of 1 to {MAX_BATCH} Outgoing")
        if not all(isinstance(m, Outgoing) for m in messages):
            raise InvalidMessage("send_batch takes rayq.Outgoing values")
        producer = self._producer
        return [producer.message(m.body, m.tenant, m.type, m.delay_s, m.ttl_s, m.key,
                                 m.priority) for m in messages]

    # -- receiving -------------------------------------------------------------------
    def receive(self, max_messages: int = 1, visibility_timeout_s: float = 30,
                wait_s: float = 0) -> list[Received]:
        """Hide and return up to ``max_messages`` messages, each with a pop receipt.

        ``wait_s`` (at most 20) long-polls: returns as soon as a message
        arrives, or empty after ``wait_s``.
        """
        return self._transport.run(self._receiving(max_messages, visibility_timeout_s, wait_s))

    async def receive_async(self, max_messages: int = 1, visibility_timeout_s: float = 30,
                            wait_s: float = 0) -> list[Received]:
        """:meth:`receive` awaited on an event loop: a long poll parks in the shard and
        no thread waits for it (the SQS endpoint serves its long polls this way)."""
        return await self._transport.run_async(
            self._receiving(max_messages, visibility_timeout_s, wait_s))

    def _receiving(self, n: int, visibility_timeout_s: float, wait_s: float) -> Steps:
        """:meth:`receive`'s requests (:data:`rayq.transport.Steps`): a pass over the
        queue's shards, then a parked one, until a message comes or ``wait_s`` passes."""
        check_count(n, "max_messages", 1, MAX_RECEIVE)
        store = self._transport.config.store
        check_seconds(visibility_timeout_s, "visibility_timeout_s", 0, store.max_visibility_timeout_s)
        check_seconds(wait_s, "wait_s", 0, MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        while True:
            got = yield from self._receive_pass(n, visibility_timeout_s, 0.0)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            got = yield from self._receive_pass(n, visibility_timeout_s, remaining, park=True)
            if got:
                return got

    def _receive_pass(self, n: int, visibility_timeout_s: float, wait_s: float,
                      park: bool = False) -> Steps:
        """One call per shard holding the queue's subqueues, in receive order; with
        ``park``, one long poll on the first of them (the whole wait if the queue lives
        on one shard, else at most PARK_SLICE_S, so the others are looked at again)."""
        queue, order, _ = yield from self._transport.route_steps(self.name)
        by_shard: dict[int, list[int]] = {}
        for sq in order:
            by_shard.setdefault(queue.subqueue(sq).shard, []).append(sq)
        if park and by_shard:
            if len(by_shard) > 1:
                wait_s = min(wait_s, PARK_SLICE_S)
            by_shard = dict([next(iter(by_shard.items()))])
        out: list[Received] = []
        for shard_index, subqueues in by_shard.items():
            dead_letter = queue.dead_letter_on(shard_index) if queue.max_receives else None
            try:
                got = yield Request(
                    SHARD_OPS["receive"], self._transport.shards[shard_index],
                    (subqueues, n - len(out), visibility_timeout_s),
                    {"max_receives": queue.max_receives, "dead_letter": dead_letter,
                     "wait_s": wait_s, "queue": self.name})
            except QueueDisabled:  # dropped since we routed (drained, retired): route anew
                yield from self._transport.route_steps(self.name, refresh=True)
                continue
            out.extend(decode_received(got))
            if len(out) >= n:
                break
        return out

    def peek(self, max_messages: int = 1) -> list[Received]:
        """The next messages, without hiding them; their ``receipt`` is None."""
        check_count(max_messages, "max_messages", 1, MAX_RECEIVE)
        queue, order, _ = self._transport.route(self.name)
        out: list[Received] = []
        for sq in order:
            shard = self._transport.shard_of(queue, sq)
            want = max_messages - len(out)
            got = self._transport.call(SHARD_OPS["peek"], shard, sq, want, queue=self.name)
            out.extend(Received.from_stored(m) for m in got)
            if len(out) >= max_messages:
                break
        return out

    # -- receipts ------------------------------------------------------------------------
    def _shard_of_receipt(self, receipt: Any, queue: QueueInfo) -> Steps:
        """(index of the shard that holds the subqueue ``receipt`` names, or None when no
        subqueue of this queue does; the route, refreshed when the subqueue was not in
        it), as :data:`Steps`. Only the subqueue is read here: the shard checks the rest.
        Raises ReceiptInvalid when ``receipt`` is not shaped like one."""
        sq = receipt_subqueue(receipt)
        if queue.subqueue(sq) is None:  # a subqueue made since we routed, or a stranger
            queue, _, _ = yield from self._transport.route_steps(self.name, refresh=True)
        info = queue.subqueue(sq)
        return (None if info is None else info.shard), queue

    def _locate(self, receipt: Any) -> Any:
        """The link of the shard a receipt of this queue points into."""
        shard, _ = self._transport.run(self._shard_of_receipt(
            receipt, self._transport.route(self.name)[0]))
        if shard is None:
            raise ReceiptInvalid(f"receipt does not belong to queue {self.name!r}")
        return self._transport.shards[shard]

    def delete(self, receipt: str) -> None:
        """Delete a received message. Raises ReceiptInvalid when the receipt is stale."""
        shard = self._locate(receipt)
        if self._transport.call(SHARD_OPS["delete"], shard, [receipt], queue=self.name):
            raise ReceiptInvalid("pop receipt is stale: the message was deleted, received "
                                 "again or had its visibility changed", (receipt,))

    def delete_batch(self, receipts: Sequence[str]) -> None:
        """Delete many messages. Valid receipts are honoured even when others are
        invalid; those raise one ReceiptInvalid listing them in ``receipts``."""
        by_shard, invalid = self._transport.run(self._by_shard(receipts))
        for stale in call_all([
                lambda shard=shard, batch=batch: self._transport.request(
                    SHARD_OPS["delete"], self._transport.shards[shard], batch, queue=self.name)
                for shard, batch in by_shard.items()]):
            invalid.extend(stale)
        _refuse_invalid(receipts, invalid)

    async def delete_batch_async(self, receipts: Sequence[str]) -> None:
        """:meth:`delete_batch` awaited on an event loop (the SQS endpoint's)."""
        by_shard, invalid = await self._transport.run_async(self._by_shard(receipts))
        for stale in await asyncio.gather(*(
                self._transport.call_async(SHARD_OPS["delete"], self._transport.shards[shard],
                                           batch, queue=self.name)
                for shard, batch in by_shard.items())):
            invalid.extend(stale)
        _refuse_invalid(receipts, invalid)

    def _by_shard(self, receipts: Sequence[str]) -> Steps:
        """({shard index: its receipts}, the receipts no subqueue of this queue holds), as
        :data:`Steps`: routed by the subqueue each receipt names; checked by the shard."""
        if not isinstance(receipts, (list, tuple)) or len(receipts) > MAX_RECEIVE:
            raise InvalidMessage(f"delete_batch takes a list of at most {MAX_RECEIVE} receipts")
        by_shard, invalid = defaultdict(list), []
        queue, _, _ = yield from self._transport.route_steps(self.name)
        for receipt in receipts:
            try:
                shard, queue = yield from self._shard_of_receipt(receipt, queue)
            except ReceiptInvalid:
                shard = None
            if shard is None:
                invalid.append(receipt)
            else:
                by_shard[shard].append(receipt)
        return dict(by_shard), invalid

    def change_visibility(self, receipt: str, timeout_s: float) -> str:
        """Hide a received message for ``timeout_s`` from now; returns the new receipt
        (the old one is invalid from then on)."""
        shard = self._locate(receipt)
        return self._transport.call(SHARD_OPS["change_visibility"], shard, receipt, timeout_s,
                                    queue=self.name)

    # -- inspection ------------------------------------------------------------------------
    def _counts(self, queue: QueueInfo, operation: str = "counts") -> dict[int, Any]:
        by_shard = defaultdict(list)
        for sq in queue.subqueues:
            by_shard[sq.shard].append(sq.id)
        parts = call_all([lambda shard=shard, ids=ids: self._transport.request(
            SHARD_OPS[operation], self._transport.shards[shard], ids, queue=self.name)
            for shard, ids in by_shard.items()])
        return {sq: n for part in parts for sq, n in part.items()}

    def count(self) -> int:
        """Messages in the queue (visible, in flight and delayed): one call per shard. The
        route is read afresh: a subqueue added since (scaling, a flooder's dedicated one)
        must be counted."""
        queue, _, _ = self._transport.route(self.name, refresh=True)
        return sum(self._counts(queue).values())

    def counts_by_visibility(self) -> tuple[int, int, int]:
        """(visible, in flight, delayed) messages: one call per shard, which reads only the
        hidden rows (SQS's ApproximateNumberOfMessages, ...NotVisible, ...Delayed)."""
        queue, _, _ = self._transport.route(self.name, refresh=True)
        parts = self._counts(queue, "visibility_counts").values()
        return tuple(sum(part[i] for part in parts) for i in range(3))

    def clear(self) -> None:
        """Delete every message of the queue, spilled ones too (not of its dead-letter
        queue): ``count()`` is 0 when this returns, and the old messages are removed in
        the background. O(subqueues)."""
        self._transport.call(MANAGER_OPS["clear_queue"], self._transport.manager, self.name)
        self._transport.route(self.name, refresh=True)

    # -- metadata and state ----------------------------------------------------------------
    def set_metadata(self, metadata: Mapping[str, str]) -> None:
        """Replace the queue's user-defined metadata: names of 1-64 letters, digits, '_' or
        '-', string values, 8 KiB in all (InvalidMessage otherwise)."""
        self._transport.call(MANAGER_OPS["set_metadata"], self._transport.manager, self.name,
                             dict(metadata) if isinstance(metadata, Mapping) else metadata)

    def metadata(self) -> QueueMetadata:
        """The queue's metadata, whether it is enabled, and its approximate message count
        (the runtime's last reading, at most a scaling interval old)."""
        return self._transport.call(MANAGER_OPS["queue_metadata"], self._transport.manager,
                                    self.name)

    def disable(self) -> None:
        """Refuse new messages (sends raise QueueDisabled); receives, deletes and the rest
        go on, so consumers drain it."""
        self._set_enabled(False)

    def enable(self) -> None:
        """Take new messages again."""
        self._set_enabled(True)

    def _set_enabled(self, enabled: bool) -> None:
        self._transport.call(MANAGER_OPS["set_enabled"], self._transport.manager, self.name,
                             enabled)
        self._transport.route(self.name, refresh=True)

    def stats(self) -> QueueStats:
        """Depth, per-key depth and oldest age, subqueues and (for the ``default`` account)
        their shards' cache counters."""
        queue, _, _ = self._transport.route(self.name, refresh=True)
        counts = self._counts(queue)
        mine = {sq.id for sq in queue.subqueues}
        keys: dict[str, KeyStats] = {}
        shard_ids = sorted({sq.shard for sq in queue.subqueues})
        for shard in shard_ids:
            ids = sorted(sq.id for sq in queue.subqueues if sq.shard == shard)
            for d in self._transport.call(SHARD_OPS["depths"], self._transport.shards[shard], ids,
                                          queue=self.name):
                if d.subqueue in mine:
                    old = keys.get(d.key, KeyStats(0, 0.0))
                    keys[d.key] = KeyStats(old.depth + d.count, max(old.oldest_age_s, d.oldest_age_s))
        try:  # the dead-letter queue is in the same account's namespace
            dlq = Queue(self._transport, self.name + DLQ_SUFFIX).count() if not queue.is_dlq else 0
        except RayqError:
            dlq = 0
        subqueues = tuple({"id": s.id, "shard": s.shard, "state": s.state.value,
                           "version": s.version, "count": counts.get(s.id, 0)}
                          for s in queue.subqueues)
        shards = ()
        if self._transport.account == ADMIN:  # shard caches hold every account's messages
            shards = tuple({"shard": st.index, **vars(st.store.cache)}
                           for st in (self._transport.call(SHARD_OPS["stats"],
                                                           self._transport.shards[s])
                                      for s in shard_ids))
        return QueueStats(self.name, sum(counts.values()), dlq, subqueues, keys, shards)


def _refuse_invalid(receipts: Sequence[str], invalid: list[str]) -> None:
    """Raise one ReceiptInvalid listing the ``invalid`` of ``receipts``, if any."""
    if invalid:
        raise ReceiptInvalid(f"{len(invalid)} of {len(receipts)} receipts were invalid",
                             tuple(invalid))

