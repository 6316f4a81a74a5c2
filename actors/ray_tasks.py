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


class RayCall:
    """How a consumer runs one type's calls as Ray tasks: :meth:`launch` starts one,
    :meth:`result` awaits it (the consumer keeps the ref between them, to cancel it)."""

    def __init__(self, tasks: "RayTasks", spec: TaskSpec, remote, demand):
        self.tasks, self.spec, self.remote, self.demand = tasks, spec, remote, demand

    async def launch(self, args: list, kwargs: dict) -> ray.ObjectRef:
        """Start a call; RuntimeFailure when no live node could take the task."""
        await self.tasks.nodes.refresh(self.tasks.clock.monotonic(), _read_nodes)
        self.tasks.nodes.check(self.spec.type, self.demand)
        remote = self.remote
        return remote.remote(*args, **kwargs)

    @staticmethod
    async def result(ref: ray.ObjectRef) -> Any:
        """The call's value, or the handler's own exception raised; Ray's error when it
        could not run (its worker died, its runtime environment failed, it was cancelled)."""
        try:
            return await ref
        except ray.exceptions.RayTaskError as err:
            raise handler_error(err) from None

    @staticmethod
    def cancel(ref: ray.ObjectRef, force: bool) -> None:
        """Ask Ray to stop the call: KeyboardInterrupt in it, or (``force``) its worker
        process killed."""
        ray.cancel(ref, force=force)


class RayTasks:
    """Makes, for a consumer, the :class:`RayCall` that runs a type's calls as Ray
    tasks; ``clock`` times its reads of the cluster's nodes."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.nodes = NodeShapes()

    def launcher(self, spec: TaskSpec, blob: bytes, options: dict[str, Any]) -> RayCall:
        """The RayCall of a type: each call runs the handler as a Ray task with
        ``options``."""
        remote = ray.remote(_task_body(blob)).options(**options)
        return RayCall(self, spec, remote, resource_demand(options))
