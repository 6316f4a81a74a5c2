"""The route cache of clients and consumers, on a fake clock: a route is used for its
time to live, then asked for again; a refresh keeps the producer's put subqueue while
that subqueue takes puts; forgetting a queue drops that affinity."""

import pytest

from rayq.core.kit.clock import FakeClock
from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueInfo, SubqueueInfo
from rayq.core.control.routes import ROUTE_TTL_S, Route, RouteCache

ALL, NO_PUT, DISABLED = SubqueueState.ALL, SubqueueState.NO_PUT, SubqueueState.DISABLED


def queue(**states: SubqueueState) -> QueueInfo:
    """A queue with subqueues ``sq<id>=state``, one per shard."""
    subqueues = tuple(SubqueueInfo(int(k[2:]), int(k[2:]), s, 1) for k, s in states.items())
    return QueueInfo("orders", subqueues, 1, None, (), 0.0)


@pytest.fixture
def clock():
    return FakeClock()


def test_a_route_is_used_until_its_time_to_live_runs_out(clock):
    cache, q = RouteCache(clock, ttl_s=1.0), queue(sq1=ALL)
    assert cache.get("orders") is None
    assert cache.put("orders", q, [1], 1) == Route(q, [1], 1)
    clock.advance(0.999)
    assert cache.get("orders") == Route(q, [1], 1)
    clock.advance(0.001)
    assert cache.get("orders") is None


def test_a_refreshed_route_starts_a_new_time_to_live(clock):
    cache = RouteCache(clock, ttl_s=1.0)
    cache.put("orders", queue(sq1=ALL), [1], 1)
    clock.advance(0.9)
    newer = queue(sq1=ALL, sq2=ALL)
    cache.put("orders", newer, [2, 1], 1)
    clock.advance(0.9)  # 1.8 s after the first answer, 0.9 s after the second
    assert cache.get("orders") == Route(newer, [2, 1], 1)


def test_routes_of_different_queues_are_kept_apart(clock):
    cache, a, b = RouteCache(clock), queue(sq1=ALL), queue(sq2=ALL)
    cache.put("a", a, [1], 1)
    cache.put("b", b, [2], 2)
    assert cache.get("a").queue is a and cache.get("b").queue is b


@pytest.mark.parametrize("state, target", [
    (ALL, 1),       # our subqueue still takes puts: keep it, whatever the manager picked
    (NO_PUT, 2),    # draining: take the manager's pick
    (DISABLED, 2),  # retired: take the manager's pick
])
def test_a_refresh_keeps_the_producers_subqueue_while_it_takes_puts(clock, state, target):
    cache = RouteCache(clock)
    cache.put("orders", queue(sq1=ALL), [1], 1)
    clock.advance(ROUTE_TTL_S)  # stale: still the one a refresh is measured against
    route = cache.put("orders", queue(sq1=state, sq2=ALL), [1, 2], 2)
    assert route.target == target and cache.get("orders").target == target


def test_a_refresh_takes_the_managers_pick_when_our_subqueue_is_gone(clock):
    cache = RouteCache(clock)
    cache.put("orders", queue(sq1=ALL), [1], 1)
    assert cache.put("orders", queue(sq2=ALL), [2], 2).target == 2


def test_a_forgotten_queue_is_asked_for_again_with_no_affinity(clock):
    cache = RouteCache(clock)
    cache.put("orders", queue(sq1=ALL), [1], 1)
    cache.forget("orders")
    assert cache.get("orders") is None
    assert cache.put("orders", queue(sq1=ALL, sq2=ALL), [1, 2], 2).target == 2
    cache.forget("never-routed")  # forgetting an unknown queue is no error


def test_a_receive_only_route_has_no_put_subqueue(clock):
    cache, q = RouteCache(clock), queue(sq1=ALL, sq2=ALL)
    assert cache.put("orders", q, [2, 1]) == Route(q, [2, 1], None)
    assert cache.put("orders", q, [1, 2]).target is None  # no affinity invented


def test_the_default_time_to_live_is_route_ttl_s(clock):
    cache = RouteCache(clock)  # what the client's transport and every consumer build
    cache.put("orders", queue(sq1=ALL), [1], 1)
    clock.advance(ROUTE_TTL_S / 2)
    assert cache.get("orders") is not None
    clock.advance(ROUTE_TTL_S / 2)
    assert cache.get("orders") is None
