"""Shard-local fair dispatch: which fairness key a receive serves next.

The first of rayq's two fairness layers (docs/fair-dispatch.md); the coordinator
(docs/fairness-coordinator.md) intervenes on top
of it with a listen order of its own (see :mod:`rayq.core.fairness.policy`). It follows
how Amazon SQS fair queues work ("How Amazon SQS fair queues work", the SQS
developer guide):

- a key is *noisy* when it holds more than ``noisy_share`` of a subqueue's
  in-flight messages (and at least ``noisy_min_inflight`` of them), or more than
  ``noisy_share`` of its recent processing time (finished handlers, decayed, and the
  time spent so far on those still running);
- receives serve quiet keys first; among keys alike, the one with the fewest
  in-flight messages per unit of weight, then the least recent processing time
  per unit of weight, then the oldest message;
- a key stops being noisy when its backlog is drained, or when it has sent
  nothing for ``noisy_idle_s``.

Serving the fewest in-flight per weight first is processor sharing: with every
key backlogged, each key's share of busy consumer threads, and so of handler
time, follows its weight, whatever its handlers cost. It is work-conserving: a
key is only passed over for another key that has a visible message.

State is per subqueue and in memory; a shard rebuilds the heads from its rows
when it opens (in-flight counts start at zero). A receive costs O(log keys):
keys with a visible first message sit in a sorted list by score, keys whose
first message is hidden or delayed sit in a timer heap until it shows.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from sortedcontainers import SortedList

from rayq.core.storage.layout import visible_since

US = 1_000_000
FAIR, FIFO = "fair", "fifo"
Head = tuple[int, int]  # a key's first row: (visible_at µs, seq)


@dataclass(frozen=True)
class DispatchPolicy:
    """How a shard orders keys (from :class:`rayq.FairnessConfig`).

    mode: "fair" (the rule above) or "fifo" (oldest visible message first, across
    keys). noisy_share / noisy_min_inflight / noisy_idle_s: the SQS thresholds.
    usage_half_life_s: how fast "recent processing time" forgets.
    weights: per key; other keys have default_weight.
    """

    mode: str = FAIR
    weights: tuple[tuple[str, float], ...] = ()
    default_weight: float = 1.0
    noisy_share: float = 0.1
    noisy_min_inflight: int = 30
    noisy_idle_s: float = 300.0
    usage_half_life_s: float = 30.0

    def weight(self, key: str) -> float:
        return dict(self.weights).get(key, self.default_weight)

    @classmethod
    def of(cls, fairness) -> "DispatchPolicy":
        """The policy a :class:`rayq.FairnessConfig` describes."""
        return cls(mode=fairness.dispatch, weights=tuple(sorted(dict(fairness.weights).items())),
                   default_weight=fairness.default_weight, noisy_share=fairness.noisy_share,
                   noisy_min_inflight=fairness.noisy_min_inflight,
                   noisy_idle_s=fairness.noisy_idle_s,
                   usage_half_life_s=fairness.usage_half_life_s)


# -- what a transaction tells the dispatcher (applied after it commits) -------------
class Took(NamedTuple):
    """A row was delivered: it is in flight at ``new_key`` until ``deadline_us``."""

    old_key: bytes
    new_key: bytes
    sq: int
    kid: int
    deadline_us: int


class Rehid(NamedTuple):
    """An in-flight row moved (its visibility changed); it stays in flight."""

    old_key: bytes
    new_key: bytes
    deadline_us: int


class Released(NamedTuple):
    """A row left flight: deleted or finished (``used``: its time counts as
    processing time), deferred, dead-lettered, expired or cleared."""

    row_key: bytes
    used: bool


class Sent(NamedTuple):
    """A key sent a message to a subqueue (for the idle rule)."""

    sq: int
    kid: int


Event = Took | Rehid | Released | Sent


@dataclass(frozen=True)
class NoisyKey:
    """A key a shard treats as noisy: since when, and its current shares."""

    subqueue: int
    key: str
    since: float
    inflight: int
    inflight_share: float
    usage_share: float


@dataclass(frozen=True)
class NoisyChange:
    """A key became noisy (``noisy``) or stopped being noisy, at ``at``."""

    subqueue: int
    key: str
    noisy: bool
    at: float
    reason: str

    @property
    def state(self) -> str:
        """"noisy" or "quiet", as logs and the event log name the new state."""
        return "noisy" if self.noisy else "quiet"


@dataclass
class _Key:
    weight: float
    inflight: int = 0
    # Recent processing time, in units of the dispatcher's epoch: every key decays at
    # the same rate, so comparing these compares recent usage without touching them.
    usage: float = 0.0
    head: Head | None = None      # (visible_at µs, seq) of the key's first row in the subqueue
    noisy_since: float | None = None
    last_sent: float = -math.inf
    entry: tuple | None = None    # its (score, kid) in the ready list, if there
    timer: int = 0                # version of its live timer-heap entry


@dataclass
class _Subqueue:
    keys: dict[int, _Key] = field(default_factory=dict)
    ready: SortedList = field(default_factory=SortedList)
    timers: list = field(default_factory=list)   # (visible_at µs, kid, version)


_EMPTY = _Subqueue()


class _Flight(NamedTuple):
    sq: int
    kid: int
    delivered_us: int
    deadline_us: int


class FairDispatch:
    """The order in which one shard's receives serve fairness keys (module docstring)."""

    def __init__(self, policy: DispatchPolicy = DispatchPolicy(),
                 name_of: Callable[[int], str | None] = str):
        self.policy = policy
        self._name_of = name_of  # key id -> name, None when not known yet
        self._subqueues: dict[int, _Subqueue] = {}
        self._flights: dict[bytes, _Flight] = {}
        self._deadlines: list[tuple[int, bytes]] = []
        self._decay = math.log(2) / policy.usage_half_life_s
        self._epoch: float | None = None  # usage values are seconds x exp(decay (t - epoch))
        self._changes: list[NoisyChange] = []  # noticed between reviews (drained backlogs)

    # -- scores -----------------------------------------------------------------
    def score(self, sq: int, kid: int, head: Head, extra_inflight: int = 0) -> tuple:
        """The sort key of a key whose first visible row is ``head`` (when it became
        visible µs, seq: not its row key's field, which carries its priority), after
        ``extra_inflight`` more deliveries: smaller is served first."""
        if self.policy.mode == FIFO:
            return head
        state = self._subqueues.get(sq, _EMPTY).keys.get(kid)
        if state is None:  # a key new in this transaction: not noisy, nothing in flight
            return (False, extra_inflight / self._weight(kid), 0.0, *head)
        return (state.noisy_since is not None, (state.inflight + extra_inflight) / state.weight,
                state.usage / state.weight, *head)

    def _weight(self, kid: int) -> float:
        return self.policy.weight(self._name_of(kid) or "")

    def _key(self, sq: int, kid: int) -> _Key:
        sub = self._subqueues.get(sq)
        if sub is None:
            sub = self._subqueues[sq] = _Subqueue()
        state = sub.keys.get(kid)
        if state is None:
            state = sub.keys[kid] = _Key(weight=self._weight(kid))
        return state

    def _place(self, sq: int, kid: int, now_us: int) -> None:
        """Put a key where it belongs now: the ready list, a timer, or nowhere."""
        sub, state = self._subqueues[sq], self._key(sq, kid)
        if state.entry is not None:
            sub.ready.remove(state.entry)
            state.entry = None
        state.timer += 1  # any timer entry of the key is stale from now on
        if state.head is None:
            return
        if state.head[0] <= now_us:
            # ranked by when its first row showed: a key's own priorities do not count
            head = (visible_since(state.head[0], now_us), state.head[1])
            state.entry = (self.score(sq, kid, head), kid)
            sub.ready.add(state.entry)
        else:
            heapq.heappush(sub.timers, (state.head[0], kid, state.timer))

    # -- what receives read ------------------------------------------------------
    def due(self, now_us: int) -> None:
        """Bring keys whose first message became visible into the ready lists, and end
        the flight of messages whose visibility lapsed."""
        while self._deadlines and self._deadlines[0][0] <= now_us:
            deadline, row_key = heapq.heappop(self._deadlines)
            flight = self._flights.get(row_key)
            if flight is not None and flight.deadline_us == deadline:
                self._land(row_key, now_us, used=False)
                self._place(flight.sq, flight.kid, now_us)
        for sq, sub in self._subqueues.items():
            while sub.timers and sub.timers[0][0] <= now_us:
                _, kid, version = heapq.heappop(sub.timers)
                state = sub.keys.get(kid)
                if state is not None and state.timer == version:
                    self._place(sq, kid, now_us)

    def next_due(self, subqueues: Collection[int]) -> float | None:
        """When the first hidden or delayed message of these subqueues shows (epoch s),
        at the earliest; None when none waits. A long poll sleeps no longer than this."""
        times = [sub.timers[0][0] for sq in subqueues
                 if (sub := self._subqueues.get(sq)) is not None and sub.timers]
        return min(times) / US if times else None

    def ready(self, sq: int) -> Iterator[tuple[tuple, int]]:
        """(score, key id) of the keys with a visible first message, best first."""
        sub = self._subqueues.get(sq)
        return iter(sub.ready) if sub is not None else iter(())

    # -- what transactions tell ----------------------------------------------------
    def apply(self, events: list[Event], heads: dict[tuple[int, int], Head | None],
              now_us: int) -> None:
        """Take a committed transaction's flights and the new first-row times of the
        (subqueue, key) pairs it touched."""
        now = now_us / US
        touched: set[tuple[int, int]] = set()  # re-ranked once each, at the end
        flights = self._flights
        for event in events:
            if isinstance(event, Took):
                if event.old_key in flights:
                    touched.add(self._land(event.old_key, now_us, used=False))
                touched.add(self._fly(event.new_key, _Flight(event.sq, event.kid, now_us,
                                                             event.deadline_us)))
            elif isinstance(event, Rehid):
                flight = flights.get(event.old_key)
                if flight is not None:
                    self._land(event.old_key, now_us, used=False)
                    touched.add(self._fly(event.new_key,
                                          flight._replace(deadline_us=event.deadline_us)))
            elif isinstance(event, Released):
                if event.row_key in flights:
                    touched.add(self._land(event.row_key, now_us, used=event.used))
            else:
                self._key(event.sq, event.kid).last_sent = now
        for sq, kid in touched - heads.keys():
            self._place(sq, kid, now_us)
        for (sq, kid), head in heads.items():
            state = self._key(sq, kid)
            state.head = head
            if head is None and state.noisy_since is not None:
                state.noisy_since = None  # backlog drained
                self._changes.append(NoisyChange(sq, self._name_of(kid), False, now, "drained"))
            if head is None and not state.inflight:
                self._drop(sq, kid)
            else:
                self._place(sq, kid, now_us)

    def _fly(self, row_key: bytes, flight: _Flight) -> tuple[int, int]:
        """A row is in flight; returns its (subqueue, key), whose rank must be redone."""
        self._flights[row_key] = flight
        heapq.heappush(self._deadlines, (flight.deadline_us, row_key))
        self._key(flight.sq, flight.kid).inflight += 1
        return flight.sq, flight.kid

    def _land(self, row_key: bytes, now_us: int, used: bool) -> tuple[int, int]:
        """A row's flight ended; returns its (subqueue, key), whose rank must be redone."""
        flight = self._flights.pop(row_key)
        state = self._key(flight.sq, flight.kid)
        state.inflight -= 1
        if used:
            state.usage += (now_us - flight.delivered_us) / US * self._growth(now_us / US)
        return flight.sq, flight.kid

    def _drop(self, sq: int, kid: int) -> None:
        sub = self._subqueues[sq]
        state = sub.keys.pop(kid)
        if state.entry is not None:
            sub.ready.remove(state.entry)

    def _growth(self, now: float) -> float:
        """exp(decay (now - epoch)); the epoch moves up (rescaling every key) before it
        could overflow, about every 290 half-lives."""
        if self._epoch is None:
            self._epoch = now
        exponent = self._decay * max(0.0, now - self._epoch)
        if exponent > 200:
            shrink = math.exp(-exponent)  # may underflow to 0: that usage is long forgotten
            self._epoch, exponent = now, 0.0
            for sq, sub in self._subqueues.items():
                for kid, state in sub.keys.items():
                    state.usage *= shrink
                    if state.entry is not None:
                        self._place(sq, kid, int(now * US))
        return math.exp(exponent)

    def _recent_use(self, now: float) -> dict[int, dict[int, float]]:
        """Per subqueue and key, recent processing time in seconds: the decayed time of
        finished messages plus the time spent so far on those in flight, so that a key
        whose handlers have not finished yet is not taken for idle."""
        growth = self._growth(now)
        use = {sq: {kid: s.usage / growth for kid, s in sub.keys.items()}
               for sq, sub in self._subqueues.items()}
        now_us = int(now * US)
        for flight in self._flights.values():
            keys = use.get(flight.sq)
            if keys is not None and flight.kid in keys:
                keys[flight.kid] += max(0, now_us - flight.delivered_us) / US
        return use

    # -- noisy keys ------------------------------------------------------------------
    def review(self, now: float) -> list[NoisyChange]:
        """Mark keys noisy or quiet by the SQS rule; returns the changes since the last
        review (also those noticed as backlogs drained). O(keys): call it about once a
        second, not per receive."""
        policy = self.policy
        now_us = int(now * US)
        recent = self._recent_use(now)
        for sq, sub in self._subqueues.items():
            inflight = sum(s.inflight for s in sub.keys.values())
            usage = recent[sq]
            used = sum(usage.values())
            for kid, state in list(sub.keys.items()):
                in_share = state.inflight / inflight if inflight else 0.0
                use_share = usage[kid] / used if used > 1e-9 else 0.0
                heavy = (in_share > policy.noisy_share and state.inflight >= policy.noisy_min_inflight
                         or use_share > policy.noisy_share)
                if state.noisy_since is None and heavy and state.head is not None:
                    state.noisy_since = now
                    self._changes.append(NoisyChange(sq, self._name_of(kid), True, now,
                                                     "in-flight share" if in_share > policy.noisy_share
                                                     and state.inflight >= policy.noisy_min_inflight
                                                     else "processing-time share"))
                    self._place(sq, kid, now_us)
                elif state.noisy_since is not None and now - state.last_sent >= policy.noisy_idle_s:
                    state.noisy_since = None
                    self._changes.append(NoisyChange(sq, self._name_of(kid), False, now, "idle"))
                    self._place(sq, kid, now_us)
        changes, self._changes = self._changes, []
        return changes

    def noisy(self, now: float) -> list[NoisyKey]:
        """The keys treated as noisy now, with their shares."""
        out = []
        recent = self._recent_use(now)
        for sq, sub in self._subqueues.items():
            inflight = sum(s.inflight for s in sub.keys.values())
            usage = recent[sq]
            used = sum(usage.values())
            for kid, state in sub.keys.items():
                if state.noisy_since is not None:
                    out.append(NoisyKey(sq, self._name_of(kid), state.noisy_since, state.inflight,
                                        state.inflight / inflight if inflight else 0.0,
                                        usage[kid] / used if used > 1e-9 else 0.0))
        return out

    def inflight(self, sq: int, kid: int) -> int:
        state = self._subqueues.get(sq, _EMPTY).keys.get(kid)
        return state.inflight if state else 0

    def forget(self, sq: int, kids: Collection[int]) -> None:
        """Drop the state of keys that have no rows left in ``sq`` (e.g. cleared)."""
        for kid in kids:
            if kid in self._subqueues.get(sq, _EMPTY).keys:
                self._drop(sq, kid)
