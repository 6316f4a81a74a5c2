"""Where a queue's subqueues are, as a client or a consumer last heard it from the manager.

Both ask the manager for a queue's route (its subqueues, their receive order and,
for a sender, the subqueue it puts to) and keep the answer a short while, so a send
or a poll does not cost a manager call.
"""

from __future__ import annotations

from typing import NamedTuple

from rayq.core.kit.clock import Clock
from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueInfo

# How long a route is used before it is asked for again. The manager's scaling pass
# runs every ScalingConfig.interval_s (1 s by default) and is what changes a route
# (a subqueue added, one set to no_put to drain): a route kept 1 s is at most one
# pass behind, so new subqueues are polled and filled within a second of existing.
# Longer saves little (one manager call a second per queue and process, against
# hundreds of sends or polls); a sender sent to a subqueue that stopped taking puts
# meanwhile is told so by the shard and refreshes at once, whatever the TTL.
ROUTE_TTL_S = 1.0


class Route(NamedTuple):
    """A queue, its subqueues in receive order, and the subqueue this process puts to
    (None for a consumer, which only receives)."""

    queue: QueueInfo
    order: list[int]
    target: int | None = None


class RouteCache:
    """Routes by queue name, each used for ``ttl_s`` seconds of ``clock.monotonic()``.

    Enqueuer affinity: a fresh route keeps the put subqueue of the one it replaces
    while that subqueue still takes puts, so one producer's messages stay in one
    subqueue, in its order (a new producer takes the manager's pick)."""

    def __init__(self, clock: Clock, ttl_s: float = ROUTE_TTL_S):
        self._clock, self._ttl_s = clock, ttl_s
        self._routes: dict[str, tuple[float, Route]] = {}

    def get(self, name: str) -> Route | None:
        """The route of queue ``name`` if one younger than ``ttl_s`` is kept, else None."""
        kept = self._routes.get(name)
        if kept is not None and self._clock.monotonic() - kept[0] < self._ttl_s:
            return kept[1]
        return None

    def stale(self, name: str) -> Route | None:
        """The route of ``name`` kept last, however old (None: never routed). While the
        manager does not answer (it is failing over) a sender or a poller goes on with
        it: the shards it names still hold its subqueues."""
        kept = self._routes.get(name)
        return None if kept is None else kept[1]

    def renew(self, name: str, err: Exception) -> Route:
        """The kept route of ``name``, used for another ``ttl_s`` because the manager did
        not answer (``err``, raised again when no route of ``name`` is kept)."""
        if name not in self._routes:
            raise err
        route = self._routes[name][1]
        self._routes[name] = (self._clock.monotonic(), route)
        return route

    def put(self, name: str, queue: QueueInfo, order: list[int],
            target: int | None = None) -> Route:
        """Keep the route the manager just gave for ``name`` and return it, with the put
        subqueue of the route it replaces (fresh or not) if that one still takes puts."""
        kept = self._routes.get(name)
        if kept is not None and kept[1].target is not None and target is not None:
            mine = queue.subqueue(kept[1].target)
            if mine is not None and mine.state is SubqueueState.ALL:
                target = mine.id
        route = Route(queue, order, target)
        self._routes[name] = (self._clock.monotonic(), route)
        return route

    def forget(self, name: str) -> None:
        """Drop the route of ``name`` (the queue was deleted or recreated): the next
        route is the manager's, with no affinity to the old one."""
        self._routes.pop(name, None)
