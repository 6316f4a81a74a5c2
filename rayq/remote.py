"""Calling runtime actors from a client: rayq errors come back as themselves, and calls
that meet a restarting actor are issued again."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from actors import NAMESPACE
from rayq.channel import ChannelLost
from rayq.errors import RayqError, RuntimeFailure

_RETRY_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ChannelLost)
_RETRY_FOR_S = 60.0


def resolve(pending: Any) -> Any:
    """The result of a call in flight: a local channel's future or a Ray ObjectRef."""
    if isinstance(pending, Future):
        return pending.result()
    return ray.get(pending)


def call(make_ref: Callable[[], Any]) -> Any:
    """The result of a remote call (:func:`resolve`), re-raising rayq errors as themselves.

    A call that meets a restarting actor (or a broken local channel) is issued again
    until it answers (shards restart by themselves and lose nothing they acknowledged).
    """
    deadline = time.monotonic() + _RETRY_FOR_S
    delay = 0.05
    while True:
        try:
            return resolve(make_ref())
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, RayqError):
                raise err.cause from None
            raise RuntimeFailure(f"runtime call failed: {err}") from err
        except _RETRY_ERRORS as err:
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"runtime actor unavailable: {err}") from err
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def call_all(makers: Sequence[Callable[[], Any]]) -> list:
    """Issue every call at once, then :func:`call` each: the ones in flight are
    resolved, and any that met a restart is issued again by its maker."""
    sent = [_issue(make) for make in makers]
    return [call(lambda first=first, make=make: first.pop() if first else make())
            for first, make in zip(sent, makers)]


def _issue(make: Callable[[], Any]) -> list:
    """[the call in flight], or [] when issuing it already met a restart (a local
    channel raises ChannelLost at once when its socket broke): :func:`call` issues
    it again."""
    try:
        return [make()]
    except _RETRY_ERRORS:
        return []


def named(name: str):
    """A runtime actor by name. Raises RuntimeFailure when it is not running."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as err:
        raise RuntimeFailure(f"the runtime actor {name!r} is not running") from err
