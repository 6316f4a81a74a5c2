"""Handlers that run as Ray tasks: the Ray side of :mod:`rayq.core.control.ray_tasks`
(docs/ray-jobs.md, "Where handlers run").

A consumer makes one remote function per (type, handler version) when it adopts the
handler table, and each call of the type launches it and awaits its ObjectRef. The
consumer never unpickles such a handler: the Ray task does, in its own runtime
environment (a handler whose module is only in the type's ``working_dir`` loads there).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

import ray
from ray import cloudpickle

from rayq.core.codec.tasks import TaskSpec
from rayq.core.control.ray_tasks import (NodeShapes, call_to_end, handler_error,
                                         live_node_resources, resource_demand)
from rayq.core.kit.clock import Clock


@functools.lru_cache(maxsize=64)
def _handler(blob: bytes) -> Callable[..., Any]:
    """A pickled handler, loaded once per Ray worker process."""
    return cloudpickle.loads(blob)


def _task_body(blob: bytes) -> Callable[..., Any]:
    """The function a type's Ray task runs: it carries the pickled handler (sent to
    Ray once, with the function), not a loaded one."""
    def run(*args, **kwargs):
        return call_to_end(_handler(blob), args, kwargs)
    return run


async def _read_nodes() -> list[dict[str, float]]:
    return live_node_resources(await asyncio.to_thread(ray.nodes))


class RayTasks:
    """Makes, for a consumer, the coroutine function that runs a type's calls as Ray
    tasks; ``clock`` times its reads of the cluster's nodes."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.nodes = NodeShapes()

    def launcher(self, spec: TaskSpec, blob: bytes, options: dict[str, Any]):
        """A coroutine function: ``await run(*args, **kwargs)`` runs the handler as a
        Ray task with ``options`` and gives back its value, or raises the handler's own
        exception; RuntimeFailure when no live node could take the task, Ray's error
        when it could not run (its worker died, its runtime environment failed)."""
        remote = ray.remote(_task_body(blob)).options(**options)
        demand = resource_demand(options)

        async def run(*args, **kwargs):
            await self.nodes.refresh(self.clock.monotonic(), _read_nodes)
            self.nodes.check(spec.type, demand)
            try:
                return await remote.remote(*args, **kwargs)
            except ray.exceptions.RayTaskError as err:
                raise handler_error(err) from None
        return run
