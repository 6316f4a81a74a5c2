"""Where a handler runs: on its consumer's threads, or as a Ray task with the resources
and runtime environment its job type asks for (docs/ray-jobs.md, "Where handlers run").

A type that sets none of ``num_cpus``, ``num_gpus``, ``memory``, ``resources`` and
``runtime_env`` runs on the consumer's threads, with no Ray call per task. A type that
sets any of them runs each call as a Ray task the consumer launches and awaits:
:func:`ray_options` builds the task's options once per (type, handler version),
:class:`NodeShapes` refuses a call no live node could ever take (Ray would keep it
pending for ever), :func:`handler_error` gives back the handler's own exception, and
:func:`call_to_end` is what the Ray task runs.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from rayq.core.codec.tasks import TaskSpec
from rayq.errors import RuntimeFailure

DEFAULT_NUM_CPUS = 1.0  # Ray's own default for a task: a type that sets no num_cpus takes one
NODES_TTL_S = 5.0       # how long a read of the cluster's nodes answers for feasibility
RAY_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "runtime_env")  # TaskSpec's


def runs_as_ray_task(spec: TaskSpec) -> bool:
    """Whether ``spec``'s handler runs as a Ray task: it sets any Ray option."""
    return any(getattr(spec, name) is not None for name in RAY_OPTIONS)


def ray_options(spec: TaskSpec) -> dict[str, Any] | None:
    """The ``.options()`` of the Ray task a call of ``spec`` runs as; None when the
    type runs on the consumer's threads (:func:`runs_as_ray_task`).

    ``num_cpus`` is the type's, else DEFAULT_NUM_CPUS; Ray never retries the task
    (``max_retries=0``: a failed delivery is retried by the queue, with back-off and
    max_receives); an absolute ``working_dir`` path becomes a ``local://`` URI (a
    directory present on the node, which Ray accepts for a task where it refuses a
    path to upload)."""
    if not runs_as_ray_task(spec):
        return None
    options: dict[str, Any] = dict(
        num_cpus=DEFAULT_NUM_CPUS if spec.num_cpus is None else spec.num_cpus,
        max_retries=0, name=f"rayq:{spec.type}")
    for name in RAY_OPTIONS[1:]:
        if getattr(spec, name) is not None:
            options[name] = getattr(spec, name)
    if spec.runtime_env is not None:
        options["runtime_env"] = task_runtime_env(spec.runtime_env)
    return options


def task_runtime_env(runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with an absolute ``working_dir`` path as a ``local://`` URI."""
    env = dict(runtime_env)
    working_dir = env.get("working_dir")
    if isinstance(working_dir, str) and os.path.isabs(working_dir):
        env["working_dir"] = "local://" + working_dir
    return env


def resource_demand(options: Mapping[str, Any]) -> dict[str, float]:
    """The resources a Ray task with ``options`` holds while it runs, by Ray's names
    (``CPU``, ``GPU``, ``memory`` in bytes, custom ones); amounts of 0 left out."""
    demand = {"CPU": options.get("num_cpus") or 0.0, "GPU": options.get("num_gpus") or 0.0,
              "memory": options.get("memory") or 0, **(options.get("resources") or {})}
    return {name: float(amount) for name, amount in demand.items() if amount}


def fits_a_node(demand: Mapping[str, float], nodes: Iterable[Mapping[str, float]]) -> bool:
    """Whether one of ``nodes`` (each its total resources) has all of ``demand``."""
    return any(all(node.get(name, 0.0) >= amount for name, amount in demand.items())
               for node in nodes)


def live_node_resources(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, float]]:
    """The total resources of each live node, from ``ray.nodes()``'s records."""
    return [dict(node.get("Resources") or {}) for node in nodes if node.get("Alive")]


class NodeShapes:
    """The total resources of the cluster's live nodes, read again when older than
    ``ttl_s`` (seconds of the monotonic clock ``now`` comes from)."""

    def __init__(self, ttl_s: float = NODES_TTL_S):
        self.ttl_s = ttl_s
        self._nodes: list[dict[str, float]] = []
        self._read_at: float | None = None

    def stale(self, now: float) -> bool:
        return self._read_at is None or now - self._read_at >= self.ttl_s

    def keep(self, nodes: list[dict[str, float]], read_at: float) -> None:
        self._nodes, self._read_at = nodes, read_at

    async def refresh(self, now: float,
                      read: Callable[[], Awaitable[list[dict[str, float]]]]) -> None:
        """Read the nodes with ``read`` if the last read is stale."""
        if self.stale(now):
            self.keep(await read(), now)

    def check(self, type_: str, demand: Mapping[str, float]) -> None:
        """Raises RuntimeFailure when no live node has ``demand``: a task of ``type_``
        would stay pending for ever. The delivery fails, and is tried again later
        (a node that joins meanwhile takes it) or dead-lettered with this error."""
        if not fits_a_node(demand, self._nodes):
            raise RuntimeFailure(f"no live node of the cluster has the resources task type "
                                 f"{type_!r} asks for: {dict(demand)}")


def handler_error(err: BaseException) -> BaseException:
    """The handler's own exception inside ``err``, a Ray task's error (its ``cause``):
    the task's outcome names the handler's error type and message, not Ray's wrapper.
    ``err`` itself when it carries none."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, Exception) else err


def call_to_end(fn: Callable[..., Any], args: Iterable[Any], kwargs: Mapping[str, Any]) -> Any:
    """``fn(*args, **kwargs)``, what a handler's Ray task runs: a coroutine function's
    coroutine is run to its end on an event loop of its own."""
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    return fn(*args, **kwargs)
