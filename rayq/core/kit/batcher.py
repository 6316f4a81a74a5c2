"""Group commit as a policy: calls that arrive while a flush is under way ride together
in the next one.

Three places batch this way: the client's sends (threads, :mod:`rayq.sending`), a
shard's transactions and a consumer's task endings (asyncio, :mod:`rayq.batching`).
What they share lives here and nowhere else: what is pending, what the next flush
takes, the size caps, how many flushes may be in flight, and how a flush's results
go back to the callers. No threads, no event loop, no clock: the adapters bring the
waiting (an Event, a Future) as an opaque ``waiter`` and hold a lock where they need one.

One flush at a time is the usual setting: with no fixed delay, calls made during a
flush wait for it and then share the next one, so a flush grows with the load.
"""

from __future__ import annotations

from typing import Any

from rayq.errors import Overloaded, RuntimeFailure


class Batch:
    """The calls one flush carries: ``items`` go to the flush, in order; ``waiters`` are
    the callers', one per call. Built by :meth:`Batcher.take`."""

    __slots__ = ("items", "waiters", "_sizes")

    def __init__(self, items: list, waiters: list, sizes: list[int] | None):
        self.items, self.waiters, self._sizes = items, waiters, sizes

    def results(self, flushed: list) -> list:
        """One result per waiter, in order, from the flush's results: one per item, or,
        for calls of several items each, the slice that call's items got. Raises
        RuntimeFailure when the flush returned another number of results than it was
        given items (a bug of the flush; its callers would otherwise wait for ever)."""
        if len(flushed) != len(self.items):
            raise RuntimeFailure(f"a flush of {len(self.items)} items returned "
                                 f"{len(flushed)} results")
        if self._sizes is None:
            return flushed
        out, at = [], 0
        for size in self._sizes:
            out.append(flushed[at:at + size])
            at += size
        return out

    def failed(self, error: BaseException) -> list:
        """One result per waiter when the flush failed as a whole: the same error for all
        (nothing of it was done, so every caller learns of it)."""
        return [error] * len(self.waiters)


class Batcher:
    """What is pending and what the next flush takes (see the module docstring).

    ``max_items``: a flush takes whole calls up to this many items (at least one call,
    however large); None takes everything pending. ``max_in_flight``: flushes under
    way at once. ``max_pending``: calls allowed to wait (not counting those in flight);
    one more raises Overloaded, naming ``name``. ``sized``: each call is a list of
    items (a send of several messages) whose results come back as one slice per call;
    otherwise each call is one item and gets one result.

    Not thread-safe: a thread adapter holds its lock around :meth:`add` and
    :meth:`take`; on one event loop no lock is needed.
    """

    __slots__ = ("name", "_max_items", "_max_in_flight", "_max_pending", "_sized",
                 "_items", "_waiters", "_in_flight", "_answered", "_last_flush_s")

    def __init__(self, *, max_items: int | None = None, max_in_flight: int = 1,
                 max_pending: int | None = None, sized: bool = False, name: str = "batcher"):
        if max_in_flight < 1 or (max_items is not None and max_items < 1):
            raise ValueError("a batcher needs max_in_flight >= 1 and max_items >= 1 (or None)")
        self.name = name
        self._max_items, self._max_in_flight = max_items, max_in_flight
        self._max_pending, self._sized = max_pending, sized
        self._items: list = []
        self._waiters: list = []
        self._in_flight = 0
        self._answered = 0         # callers the last flush answered
        self._last_flush_s = 0.0   # how long it took

    def __len__(self) -> int:
        """Calls waiting for a flush (not those in one)."""
        return len(self._waiters)

    @property
    def in_flight(self) -> int:
        """Flushes under way: callers of :meth:`add` told to lead and not yet told to stop."""
        return self._in_flight

    def add(self, item: Any, waiter: Any) -> bool:
        """Queue one call; True when its caller must lead flushes (call :meth:`take` until
        it returns None), False when a leader under way will take it. Raises Overloaded
        when ``max_pending`` calls already wait."""
        if self._max_pending is not None and len(self._waiters) >= self._max_pending:
            raise Overloaded(f"{self.name} has {len(self._waiters)} calls waiting")
        self._items.append(item)
        self._waiters.append(waiter)
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            return True
        return False

    def take(self) -> Batch | None:
        """The next flush's calls, oldest first; None when nothing is pending, which ends
        the leader's turn (it flushes no more until :meth:`add` tells it to lead again)."""
        if not self._waiters:
            self._in_flight -= 1
            return None
        cut = self._cut()
        if cut == len(self._waiters):  # the common case: take all, no copy
            items, waiters = self._items, self._waiters
            self._items, self._waiters = [], []
        else:
            items, waiters = self._items[:cut], self._waiters[:cut]
            del self._items[:cut], self._waiters[:cut]
        if not self._sized:
            return Batch(items, waiters, None)
        return Batch([one for call in items for one in call], waiters, [len(c) for c in items])

    def flushed(self, batch: Batch, seconds: float) -> None:
        """A flush of ``batch`` ended after ``seconds`` (see :meth:`linger`)."""
        self._answered, self._last_flush_s = len(batch.waiters), seconds

    def linger(self, max_s: float) -> tuple[int, float] | None:
        """(callers, seconds): before taking, a leader may wait until this many callers are
        pending, at most these seconds; None: take now.

        Callers just answered usually call again at once (a thread sending in a loop).
        Without the wait, the one caller that arrived during a flush goes out alone,
        and the rest in the flush after: flushes of 1 and 7 in turn with 8 threads. So
        a leader that finds fewer callers pending than the last flush answered waits
        for them, at most half that flush's time (and ``max_s``). A caller alone never
        waits: with nobody pending there is nobody to lead."""
        if 0 < len(self._waiters) < self._answered:
            return self._answered, min(max_s, self._last_flush_s / 2)
        return None

    def pass_lead(self) -> Any:
        """After a flush: the waiter of the oldest pending call, who leads next (the lead
        passes on, so no caller leads for others for long); None when nothing is
        pending, which ends this lead."""
        if self._waiters:
            return self._waiters[0]
        self._in_flight -= 1
        return None

    def leave(self) -> None:
        """A leader stops before :meth:`take` or :meth:`pass_lead` said so (its flush was
        cancelled, or the caller it would pass the lead to already holds one): the next
        :meth:`add` may lead again."""
        self._in_flight -= 1

    def _cut(self) -> int:
        """How many of the oldest pending calls the next flush takes."""
        cap, pending = self._max_items, len(self._waiters)
        if cap is None:
            return pending
        if not self._sized:
            return min(cap, pending)
        cut, size = 0, 0
        for call in self._items:
            if cut and size + len(call) > cap:
                break
            cut, size = cut + 1, size + len(call)
        return cut
