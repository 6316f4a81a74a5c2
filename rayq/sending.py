"""The producer path: one :class:`Producer` per queue and transport takes a message
from its attributes to a durable put.

It checks a message's attributes and encodes its body (once, where it enters),
lets concurrent senders of any thread share one put call (client-side group
commit, :class:`~rayq.batching.ThreadBatcher`), routes the put to the transport's
put subqueue, and routes anew when that subqueue was retired
(``QueueDisabled``). ``Queue.send``/``send_batch``, ``Client.submit_many`` and,
through ``Queue``, the SQS endpoint all send through it; nothing here calls back
into them.

No Ray here: the producer reaches the runtime only through its transport
(:class:`Link`), so a unit test drives it with a fake one.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from typing import TYPE_CHECKING, Any, Protocol

from rayq.batching import ThreadBatcher
from rayq.core.auth.operations import SHARD_OPS
from rayq.core.codec.model import (MAX_BATCH, SubqueueState, check_name, check_priority,
                                   check_seconds, encode_body, fairness_key, to_us)
from rayq.core.codec.wire import Attrs, Entry, encode_put
from rayq.core.kit.batcher import Batcher
from rayq.errors import QueueDisabled
from rayq.steps import Request, Steps

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rayq.config import Config

PUT_ATTEMPTS = 3       # routes tried when subqueues are retired under the sender
# A batch this large is a put of its own: coalescing adds nothing to it, and threads
# sending such batches each keep a lane of the queue's open subqueues, so that their
# puts go to several shards at once (as clients of their own transports did).
OWN_PUT_MESSAGES = 64
MAX_LANES = 64  # lanes a producer keeps (lane_target wraps them round the open subqueues)

Placed = tuple[str, int]  # a stored message's id and the index of the shard holding it


class Link(Protocol):
    """What a producer needs of its transport (:class:`~rayq.transport.Transport`)."""

    config: Config
    shards: Sequence[Any]

    @property
    def account(self) -> str: ...

    def route_steps(self, name: str, refresh: bool = False) -> Steps: ...

    def run(self, steps: Steps) -> Any: ...

    async def run_async(self, steps: Steps) -> Any: ...


class Producer:
    """Sends to queue ``name`` through ``transport`` (see the module docstring).

    Group commit: a sender that finds fewer than ``max_in_flight`` puts under way leads
    one, taking whole pending sends up to ``max_messages``; the others wait, and the lead
    then passes to the oldest of them. One in flight is the default: measured with 8
    threads on 2 cores over the local channel, it made the largest puts and the most
    messages a second (2 846 and 3 056, beside 1 935 and 2 278 with two in flight, 1 791
    and 2 220 with three). Each sender returns only after its own messages are durable.
    """

    def __init__(self, transport: Link, name: str, *, max_messages: int = MAX_BATCH,
                 max_in_flight: int = 1):
        self.name = name
        self._transport = transport
        self._lanes, self._lane = itertools.count(), threading.local()
        self._batcher = dict(max_items=max_messages, max_in_flight=max_in_flight, sized=True)
        self._coalescers = {0: self._lane_coalescer(0)}  # per lane: its threads' sends
        self._new_lane = threading.Lock()

    def __repr__(self) -> str:
        return f"Producer({self.name!r})"

    def __len__(self) -> int:
        """Sends waiting for a put (not those in one)."""
        return sum(len(c) for c in list(self._coalescers.values()))

    @property
    def in_flight(self) -> int:
        """Puts under way."""
        return sum(c.in_flight for c in list(self._coalescers.values()))

    # -- a message's shape -------------------------------------------------------------
    def attrs(self, tenant: str | None, type: str, delay_s: float, ttl_s: float | None,
              task: bool = False, key: str | None = None, priority: int = 0) -> Attrs:
        """A message's attributes, checked once, here (sends and task submissions).
        ``tenant`` None is the transport's account; ``key`` None the runtime's fairness
        key (another key: a message group, which an ordered queue takes, and a plain queue
        the sending account owns); ``priority`` 0..9 orders the key's own ready messages.
        Raises InvalidMessage."""
        config = self._transport.config
        tenant = self._transport.account if tenant is None else tenant
        check_name(tenant, "tenant")
        check_name(type, "type")
        check_seconds(delay_s, "delay_s", 0, config.store.max_delay_s)
        if ttl_s is not None:
            check_seconds(ttl_s, "ttl_s", 0.001, config.store.max_ttl_s)
        key = fairness_key(tenant, type, config.fairness.key) if key is None \
            else check_name(key, "key")
        return Attrs(tenant, type, key, to_us(delay_s), None if ttl_s is None else to_us(ttl_s),
                     task, check_priority(priority))

    def message(self, body: Any, tenant: str | None = None, type: str = "default",
                delay_s: float = 0, ttl_s: float | None = None, key: str | None = None,
                priority: int = 0) -> Entry:
        """(attributes, encoded body): a message checked and encoded once, here. Raises
        InvalidMessage, or MessageTooLarge past the store's ``max_message_bytes``."""
        return (self.attrs(tenant, type, delay_s, ttl_s, key=key, priority=priority),
                encode_body(body, self._transport.config.store.max_message_bytes))

    # -- putting -----------------------------------------------------------------------
    def put(self, entries: list[Entry]) -> list[Placed]:
        """Store ``entries`` durably (fsync'd before this returns), with whatever other
        senders of this producer's lane have pending; (message id, shard index) per entry,
        in order. Raises the put's error (QueueDisabled when every route tried was retired).

        Every send of a thread goes to its lane's subqueue: lane 0 (the routed put
        subqueue) until the thread sends a large batch, then a lane of its own, its
        single sends too, so one sender's messages stay on one shard, in the order sent."""
        lane = getattr(self._lane, "index", 0)
        if len(entries) >= OWN_PUT_MESSAGES:
            return self._put_now(entries, self._thread_lane())
        return self._coalescers[lane].call(entries)

    def put_spread(self, entries: list[tuple]) -> list[Placed]:
        """:meth:`put` of tasks under ids their submitter chose, apart from other sends:
        each to the open subqueue its id picks (the same one while the queue's subqueues
        stay as they are), one put per subqueue. Puts of one id meet in one store, which
        stores such a task once."""
        by_spread: dict[str, list[int]] = {}
        for at, entry in enumerate(entries):
            by_spread.setdefault(entry[2], []).append(at)
        placed: list = [None] * len(entries)
        for ats in _merged_by_target(self._transport, self.name, by_spread):
            got = self._transport.run(self._putting([entries[at] for at in ats],
                                                    spread=entries[ats[0]][2]))
            for at, one in zip(ats, got):
                placed[at] = one
        return placed

    def _thread_lane(self) -> int:
        """This thread's lane: the first thread to send a large batch gets 0, the next 1...
        (up to MAX_LANES, then round again); its single sends coalesce in that lane."""
        lane = getattr(self._lane, "index", None)
        if lane is None:
            with self._new_lane:
                lane = next(self._lanes) % MAX_LANES
                if lane not in self._coalescers:
                    self._coalescers[lane] = self._lane_coalescer(lane)
            self._lane.index = lane
        return lane

    def _lane_coalescer(self, lane: int) -> ThreadBatcher:
        return ThreadBatcher(Batcher(**self._batcher, name=f"sends to {self.name} ({lane})"),
                             lambda entries: self._put_now(entries, lane))

    async def put_async(self, entries: list[Entry]) -> list[Placed]:
        """:meth:`put` awaited on an event loop (the SQS endpoint's): a put call of its own,
        which the shard's group commit joins with the others arriving at once."""
        return await self._transport.run_async(self._putting(entries))

    def _put_now(self, entries: list[Entry], lane: int = 0) -> list[Placed]:
        return self._transport.run(self._putting(entries, lane))

    def _putting(self, entries: list[Entry], lane: int = 0, spread: str | None = None) -> Steps:
        """One put call of ``entries``, encoded into one buffer (however many senders
        share it), to the queue's put subqueue as last routed (``lane`` > 0: that many
        open subqueues further on; ``spread``: the open subqueue it picks); routed anew
        and sent again while the shard says that subqueue was retired."""
        batch = encode_put(entries)
        for attempt in range(PUT_ATTEMPTS):
            queue, _, target = yield from self._transport.route_steps(self.name,
                                                                      refresh=attempt > 0)
            if queue.disabled:  # as last routed: routed anew once before it is believed
                if attempt:
                    raise QueueDisabled(f"queue {self.name!r} is disabled: it refuses new messages")
                continue
            target = lane_target(queue, target, lane) if spread is None \
                else spread_target(queue, target, spread)
            index = queue.subqueue(target).shard
            try:
                ids = yield Request(SHARD_OPS["put"], self._transport.shards[index],
                                    (target, batch), {"queue": self.name})
            except QueueDisabled:
                continue  # the subqueue was retired: ask for another
            return [(mid, index) for mid in ids]
        raise QueueDisabled(f"queue {self.name!r} accepts no messages")


def _merged_by_target(transport: Link, name: str, by_spread: dict[str, list[int]]) -> list:
    """The entry positions of ``by_spread`` merged per open subqueue their spread keys pick
    (as routed now), each list in order."""
    queue, _, target = transport.run(transport.route_steps(name))
    merged: dict[int, list[int]] = {}
    for spread, ats in by_spread.items():
        merged.setdefault(spread_target(queue, target, spread), []).extend(ats)
    return [sorted(ats) for ats in merged.values()]


def _open_subqueues(queue: Any) -> list[int]:
    return [s.id for s in queue.subqueues if s.state is SubqueueState.ALL and not s.dedicated]


def spread_target(queue: Any, target: int, spread: str) -> int:
    """The open subqueue ``spread`` picks (a stable hash of it over the queue's open
    subqueues); ``target`` when none is open."""
    open_ = _open_subqueues(queue)
    return open_[zlib.crc32(spread.encode()) % len(open_)] if open_ else target


def lane_target(queue: Any, target: int, lane: int) -> int:
    """The subqueue ``lane`` puts to: ``lane`` open subqueues after ``target`` (the put
    subqueue as routed), round the queue's subqueues that take puts."""
    if not lane:
        return target
    open_ = _open_subqueues(queue)
    if target not in open_:
        return target
    return open_[(open_.index(target) + lane) % len(open_)]
