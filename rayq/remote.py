"""Calling runtime actors, from a client or from another actor: one way for both.

rayq errors a runtime actor raised come back as themselves, any other failure of
the call as RuntimeFailure, and a call that meets a restarting actor (or a broken
local channel, :mod:`rayq.channel`) is issued again on a
:class:`rayq.core.kit.retry.RetrySchedule`: shards, the manager, the coordinator and
the flood detector restart by themselves and lose nothing they acknowledged.
:func:`call` and :func:`call_all` block (clients); :func:`call_async`,
:func:`call_all_async` and :func:`answers` await (actors).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from contextvars import ContextVar
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from rayq.names import MANAGER, namespace, shard_name
from rayq.channel import BetweenPlaces, ChannelLost, ShardLink, actor_lost
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.retry import RetrySchedule
from rayq.core.replication.shard_places import decode_places
from rayq.errors import NotEnoughReplicas, RayqError, RuntimeFailure, StaleEpoch

RETRY = RetrySchedule()  # clients: up to a minute, while a shard restarts
# Calls between runtime actors: long enough for a peer's restart, short enough that a
# peer gone for good shows up as a failed round of a background loop within seconds
# (the next round asks again; a lost task end means the task runs again).
IN_RUNTIME = RetrySchedule(give_up_after_s=5.0)
NO_RETRY = RetrySchedule(give_up_after_s=0.0)  # best-effort calls: the next round asks again
_CLOCK = SystemClock()
# A shard's leader moving (docs/replication.md): the call is issued again, to the new one.
_MOVING = (StaleEpoch, NotEnoughReplicas)


# Set while code runs on an event loop that must not wait for a call (the SQS endpoint's
# hot path): a blocking call raises WouldBlock there, before it is issued.
NO_WAITING: ContextVar[bool] = ContextVar("no_waiting", default=False)


class WouldBlock(Exception):
    """A blocking call was about to be made where NO_WAITING is set; nothing was sent."""


def _may_wait() -> None:
    if NO_WAITING.get():
        raise WouldBlock("a blocking runtime call on an event loop")


def resolve(pending: Any, timeout_s: float | None = None) -> Any:
    """The result of a call in flight: a local channel's future or a Ray ObjectRef
    (waited for at most ``timeout_s``: then GetTimeoutError)."""
    if isinstance(pending, Future):
        return pending.result(timeout_s)
    return ray.get(pending, timeout=timeout_s)


async def resolve_async(pending: Any) -> Any:
    """:func:`resolve` without blocking the event loop (``pending`` may also be a task of
    this loop: a call to the shard this process runs, made on its loop)."""
    if isinstance(pending, Future):
        return await asyncio.wrap_future(pending)
    return await pending


def call(make_ref: Callable[[], Any], schedule: RetrySchedule = RETRY,
         clock: Clock = _CLOCK, timeout_s: float | None = None) -> Any:
    """The result of the remote call ``make_ref`` makes (:func:`resolve`, each attempt
    waited for at most ``timeout_s``), issued again while its actor restarts. Raises
    the RayqError the actor raised, or RuntimeFailure."""
    _may_wait()
    started, attempt = clock.monotonic(), 0
    while True:
        try:
            return resolve(make_ref(), timeout_s)
        except _failed() as err:
            attempt += 1
            _again_or_raise(err, schedule, started, clock)
            time.sleep(schedule.wait_s(attempt))


def call_all(makers: Sequence[Callable[[], Any]]) -> list:
    """Issue every call at once, then :func:`call` each: the ones in flight are
    resolved, and any that met a restart is issued again by its maker."""
    _may_wait()
    sent = [_issue(make) for make in makers]
    return [call(lambda first=first, make=make: first.pop() if first else make())
            for first, make in zip(sent, makers)]


async def call_async(make_ref: Callable[[], Any], schedule: RetrySchedule = IN_RUNTIME,
                     clock: Clock = _CLOCK) -> Any:
    """:func:`call` for actors: awaits the call instead of blocking the event loop."""
    started, attempt = clock.monotonic(), 0
    while True:
        try:
            return await resolve_async(make_ref())
        except _failed() as err:
            attempt += 1
            _again_or_raise(err, schedule, started, clock)
            await asyncio.sleep(schedule.wait_s(attempt))


async def call_all_async(make_refs: Iterable[Callable[[], Any]]) -> list:
    """:func:`call_async` of many calls at once; their answers in order (the first
    failure is raised)."""
    return list(await asyncio.gather(*(call_async(make) for make in make_refs)))


async def answers(make_refs: Iterable[Callable[[], Any]]) -> list:
    """The answers of calls to many actors at once, without those that failed (an
    actor restarting, or gone: best-effort fan-outs ask again next round)."""
    results = await asyncio.gather(*(call_async(make, NO_RETRY) for make in make_refs),
                                   return_exceptions=True)
    return [r for r in results if not isinstance(r, BaseException)]


def _restarting() -> tuple[type[BaseException], ...]:
    """What a call meets while its actor restarts, or while a shard's leader moves
    (its node is gone, a replaced leader refuses, or too few copies are in sync for a
    moment: docs/replication.md); read when raised: importing this module touches nothing
    of Ray's."""
    return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ChannelLost,
            BetweenPlaces, ray.exceptions.ActorUnschedulableError, StaleEpoch,
            NotEnoughReplicas)


def _failure(err: ray.exceptions.RayTaskError) -> RayqError:
    """The error a failed call raises: the actor's own RayqError, else RuntimeFailure."""
    if isinstance(err.cause, RayqError):
        return err.cause
    return RuntimeFailure(f"runtime call failed: {err}")


def _chained(err: ray.exceptions.RayTaskError) -> BaseException | None:
    """A RayqError re-raised as itself carries no Ray wrapper; a failure keeps its cause."""
    return None if isinstance(err.cause, RayqError) else err


def _failed() -> tuple[type[BaseException], ...]:
    return (ray.exceptions.RayTaskError,) + _restarting()


def _again_or_raise(err: BaseException, schedule: RetrySchedule, started: float,
                    clock: Clock) -> None:
    """Return when the call is to be issued again: its actor restarts, or its shard's
    leader moves, and ``schedule`` does not give up yet. Else raise the RayqError the
    actor raised, or RuntimeFailure."""
    cause = err.cause if isinstance(err, ray.exceptions.RayTaskError) else err
    if isinstance(err, ray.exceptions.RayTaskError) and not isinstance(cause, _MOVING):
        raise _failure(err) from _chained(err)
    actor_lost()
    if not schedule.gives_up(started, clock.monotonic()):
        return
    if isinstance(cause, _MOVING):
        raise cause
    raise RuntimeFailure(f"runtime actor unavailable: {err}") from err


def actor_names() -> list[str]:
    """The names of the runtime's actors that run now (namespace ``rayq``), sorted."""
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == namespace())


def running(names: Iterable[str]) -> dict[str, Any]:
    """Handles of those runtime actors in ``names`` that run now, by name (one gone
    between a listing and this lookup is left out)."""
    out = {}
    for name in names:
        try:
            out[name] = ray.get_actor(name, namespace=namespace())
        except ValueError:
            pass
    return out


def _issue(make: Callable[[], Any]) -> list:
    """[the call in flight], or [] when issuing it already met a restart (a local
    channel raises ChannelLost at once when its socket broke): :func:`call` issues
    it again."""
    try:
        return [make()]
    except _restarting():
        return []


def named(name: str):
    """A runtime actor by name. Raises RuntimeFailure when it is not running."""
    try:
        return ray.get_actor(name, namespace=namespace())
    except ValueError as err:
        raise RuntimeFailure(f"the runtime actor {name!r} is not running") from err


def shard_link(index: int, use_channel: bool = False) -> ShardLink:
    """A link to shard ``index`` that finds its leader again when it moved (failover);
    its hot calls over the local channel if ``use_channel`` and on this host."""
    # looked up at first use: a control actor that starts while a shard fails over
    # (both were on a lost node) starts all the same
    return ShardLink(None, use_channel, functools.partial(named, shard_name(index)))


def manager_handle() -> ShardLink:
    """A link to the manager that finds it again once it moved (its control store
    failed over to another node: docs/replication.md). Raises ValueError while no
    manager runs."""
    return ShardLink(ray.get_actor(MANAGER, namespace=namespace()), False, _find_manager)


def manager_link() -> ShardLink:
    """:func:`manager_handle` for an actor, which may start before the manager does
    (both failing over): the manager is looked up at the link's first use."""
    return ShardLink(None, False, _find_manager)


_find_manager = functools.partial(named, MANAGER)


# -- the shards, as many as the runtime placed (docs/autoscaling.md) ---------------------
PLACEMENT_KEY = b"rayq/placement"  # in Ray's GCS key-value store: each shard's ShardPlace


def published_shards() -> int:
    """How many shards the runtime runs: those its manager last published a place of
    (``actors.data_nodes.publish``; 0 before any). Shards are numbered from 0."""
    import ray.experimental.internal_kv as internal_kv

    raw = internal_kv._internal_kv_get(PLACEMENT_KEY, namespace=namespace())
    return max(decode_places(raw), default=-1) + 1


class ShardLinks:
    """Every shard's link (:func:`shard_link`) by index. Scaling adds shards while the
    runtime runs: indexing a shard past the ones known links it at once (a queue's
    subqueue named it), and :meth:`refresh` learns how many the runtime placed.
    Iterating goes over the shards known so far. Thread-safe."""

    def __init__(self, count: int = 0, use_channel: bool = False, links: Iterable = ()):
        self._use_channel = use_channel
        self._links = list(links)
        self._lock = threading.Lock()
        self.grow(count)

    def grow(self, count: int) -> ShardLinks:
        """Links to at least ``count`` shards."""
        with self._lock:
            while len(self._links) < count:
                self._links.append(shard_link(len(self._links), self._use_channel))
        return self

    def refresh(self) -> ShardLinks:
        """Links to every shard the runtime placed (one read of Ray's GCS)."""
        return self.grow(published_shards())

    def __getitem__(self, index: int) -> ShardLink:
        if index >= len(self._links):
            self.grow(index + 1)
        return self._links[index]

    def __len__(self) -> int:
        return len(self._links)

    def __iter__(self):
        return iter(list(self._links))

    def __reduce__(self):
        """Sent to another actor (an SQS endpoint, a consumer) as the links known now;
        its own lock is made there."""
        return ShardLinks, (0, self._use_channel, list(self._links))
