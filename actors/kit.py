"""What the runtime's actors share, said once: finding each other, background loops whose
failures are counted, and, for the control actors (manager, fairness coordinator,
flood detector), their own LMDB environment, a durable gate and the shard handles.

A control actor subclasses :class:`ControlActor` and keeps to its own work; its signed
surface is its entries in :mod:`rayq.core.auth.operations` (``@signed`` methods).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import ray

from actors import MANAGER, NAMESPACE
from actors.metrics import BackgroundFailures
from rayq.config import Config
from rayq.core.auth.gate import Directory, Gate, durable_gate
from rayq.core.kit.clock import Clock, SystemClock
from rayq.core.kit.kv import LmdbKV
from rayq.remote import call_async, shard_link

CONTROL_MAP_BYTES = 64 << 20  # a control actor's LMDB: registries, rules, histories


def manager_handle():
    """The manager's handle (raises ValueError while it does not run)."""
    return ray.get_actor(MANAGER, namespace=NAMESPACE)


def shard_handles(config: Config, use_channel: bool = False) -> list:
    """Every shard's handle, by index: links that find a shard's leader again when it
    moved (failover, docs/replication.md), their hot calls over the local channel if
    ``use_channel``."""
    return [shard_link(i, use_channel) for i in range(config.store.shards)]


async def manager_directory() -> Directory:
    """The directory gates verify signed requests with, as the manager holds it (how
    actors other than the manager fetch it)."""
    manager = manager_handle()
    return await call_async(lambda: manager.directory.remote())


def open_kv(data_dir: str, component: str, map_size: int = CONTROL_MAP_BYTES) -> LmdbKV:
    """An actor's own LMDB environment, in ``data_dir/component``."""
    return LmdbKV(os.path.join(data_dir, component), map_size=map_size)


class RuntimeActor:
    """A runtime actor: its clock, its background loops (failures logged and counted,
    :class:`~actors.metrics.BackgroundFailures`) and the calls every runtime actor
    answers. A subclass sets ``self.gate`` (a :class:`~rayq.core.auth.gate.Gate`)."""

    gate: Gate

    def __init__(self, component: str, clock: Clock | None = None, index: int | None = None):
        self.clock = clock or SystemClock()
        self.failures = BackgroundFailures(component, index)
        self._loops: list[asyncio.Task] = []

    def run_every(self, interval_s: float, loop: str, step: Callable[[], Awaitable]) -> None:
        """Run ``step`` every ``interval_s`` seconds for the actor's life; a failed round
        is counted and the next one tries again."""
        self._loops.append(asyncio.get_running_loop().create_task(
            self.failures.every(interval_s, loop, step)))

    async def ping(self) -> bool:
        """True once the actor is up (the runtime waits for it at start)."""
        return True

    async def forget_keys(self) -> None:
        """Account keys or task queues changed: verify the next signed request with a
        fresh copy of the directory."""
        self.gate.forget()

    async def background_failures(self) -> dict[str, int]:
        """Failed rounds of each background loop since the actor started."""
        return dict(self.failures.counts)


class ControlActor(RuntimeActor):
    """A control actor: a :class:`RuntimeActor` with its own LMDB environment
    (``self.kv``), a gate whose seen nonces live there, and the shard handles.
    ``directory``: where its gate fetches accounts and places (the manager's own
    method for the manager; by default, a call to the manager)."""

    def __init__(self, component: str, data_dir: str, config: Config, clock: Clock | None = None,
                 *, directory: Callable[[], Awaitable[Directory]] = manager_directory):
        super().__init__(component, clock)
        self.data_dir, self.config = data_dir, config
        self.kv = open_kv(data_dir, component)
        self.gate = durable_gate(directory, self.kv, self.clock)
        self.shards = shard_handles(config)
