"""FloodDetector: the flooder list, isolation, spill routing and the sweeper
(docs/flood-detection.md).

Every interval it reads each shard's counts (kept locally by the shards as
enqueues happen: no enqueue waits on the network for them), applies the
rules of :mod:`rayq.core.flood.detection`, and then:

- isolates a new flooder: a dedicated subqueue on every shard its queue uses,
  and its visible messages moved there;
- tells every shard which (type, tenant) puts to divert to its spill store
  (the shards keep that copy of the list; enqueues never ask anyone);
- sweeps spilled messages back into the dedicated subqueues, a batch (one
  transaction) at a time, only while the shard is healthy;
- removes flooders that subsided and coalesces their dedicated subqueues.

Every detection, isolation, sweep batch, pause and removal is an event.
"""

from __future__ import annotations

import asyncio
import json

import ray

from actors.base import LIVENESS_GROUPS, ControlActor
from actors.metrics import FloodMetrics
from rayq.analytics.eventlog import open_event_log
from rayq.config import Config
from rayq.core.auth.operations import FLOOD_OPS
from rayq.core.kit.clock import Clock
from rayq.core.flood.detection import Flooder, build_view, detect, sweep_step
from rayq.core.auth.gate import signed
from rayq.core.kit.history import EventHistory
from rayq.core.flood.isolation import (dedicated_by_shard, dedicated_on, dedicated_to, diverts,
                                 fully_swept, isolation_moves, left_to_sweep, listed,
                                 shards_lacking_dedicated, spilled_on, subqueue_layout,
                                 with_sweeps)
from rayq.core.codec.model import pack, unpack
from rayq.core.control.registry import QueueInfo
from rayq.remote import call_all_async, call_async, manager_link

MOVE_ROWS_PER_CALL = 5_000
MAX_SWEEP_BATCHES = 500   # per flooder and shard in one run: the next run goes on


class FloodDetector(ControlActor):
    def __init__(self, data_dir: str, config: Config, clock: Clock | None = None,
                 start_copy=None):
        super().__init__("flood", data_dir, config, clock, start_copy=start_copy)
        self.flood_config = config.flood
        self.history = EventHistory(self.kv, 1000)
        self.metrics = FloodMetrics()
        self.events = open_event_log(data_dir, "flood", config.analytics)
        raw = self.kv.read(lambda txn: txn.get("meta", b"flooders"))
        self.flooders: list[Flooder] = [Flooder(**f) for f in unpack(raw)] if raw else []
        self.manager = manager_link()
        self._run_every(self.flood_config.interval_s, "detection", self._detect_round)

    @signed(FLOOD_OPS["flooders_now"])
    async def flooders_now(self) -> list[Flooder]:
        return list(self.flooders)

    @signed(FLOOD_OPS["events"])
    async def events(self) -> tuple[dict, ...]:
        return self.history.recent()

    # -- one run ---------------------------------------------------------------------
    async def detect_once(self) -> list[Flooder]:
        queues: dict[str, QueueInfo] = await call_async(lambda: self.manager.flood_layout.remote())
        # every shard the layout names was published before (scaling adds shards)
        snapshots = await call_all_async((lambda s=s: s.flood_snapshot.remote())
                                         for s in self.shards.refresh())
        view = build_view(subqueue_layout(queues), [s["tenant_counts"] for s in snapshots],
                          [s["enqueues"] for s in snapshots])
        changes = detect(view, self.flooders, self.flood_config, self.clock.now())
        for flooder in changes.added:
            self._event("detected", flooder, depth=flooder.depth)
            await self._isolate(flooder, queues)
        flooders = listed(changes, queues)
        for flooder in flooders:  # subqueues added since (scaling) get a dedicated twin
            await self._dedicated(flooder, queues[flooder.queue])
        # with the new subqueues
        queues = await call_async(lambda: self.manager.flood_layout.remote())
        await self._route(queues, flooders)
        self.flooders = flooders  # published once the shards divert their puts
        for flooder in changes.removed:
            await self._release(flooder, queues)
        emptied = await self._sweep(queues, snapshots)
        self.flooders = with_sweeps(self.flooders, emptied)
        self.kv.transact(lambda txn: txn.put("meta", b"flooders",
                                             pack([vars(f) for f in self.flooders])))
        self.metrics.update(self.flooders)
        return list(self.flooders)

    async def _isolate(self, flooder: Flooder, queues: dict[str, QueueInfo]) -> None:
        """A dedicated subqueue on every shard of the queue; visible messages move there."""
        queue = queues[flooder.queue]
        moved = 0
        for shard, source, target in isolation_moves(queue, await self._dedicated(flooder, queue)):
            moved += await self._move_all(shard, source, target, flooder)
        self._event("isolated", flooder, moved=moved)

    async def _dedicated(self, flooder: Flooder, queue: QueueInfo) -> dict[int, int]:
        """The flooder's dedicated subqueue on every shard its queue uses, by shard; the
        manager is asked only for shards that have none yet (e.g. after scaling)."""
        out = dedicated_by_shard(queue, flooder)
        for shard in shards_lacking_dedicated(queue, out):
            sq = await call_async(lambda: self.manager.add_dedicated.remote(
                flooder.queue, shard, flooder.type, flooder.tenant))
            out[shard] = sq.id
        return out

    async def _move_all(self, shard: int, source: int, target: int, flooder: Flooder) -> int:
        moved, cursor = 0, None
        while True:
            n, cursor = await call_async(lambda: self.shards[shard].move_matching.remote(
                source, target, flooder.type, flooder.tenant, MOVE_ROWS_PER_CALL, cursor))
            moved += n
            if cursor is None:
                return moved

    async def _route(self, queues: dict[str, QueueInfo], flooders: list[Flooder]) -> None:
        """Tell each shard which flooders' puts to its subqueues to spill, and which of
        its subqueues are dedicated (served on their turns)."""
        shards = len(self.shards)
        await call_all_async((lambda s=s, d=d, own=own: s.set_diverts.remote(d, own))
                             for s, d, own in zip(self.shards, diverts(queues, flooders, shards),
                                                  dedicated_on(queues, shards)))

    async def _release(self, flooder: Flooder, queues: dict[str, QueueInfo]) -> None:
        """The shards no longer spill its puts (routed before this): what it spilled
        since the last sweep (few, or it would not leave) goes back, then its dedicated
        subqueues drain and go like any retired subqueue."""
        queue = queues.get(flooder.queue)
        for sq in dedicated_to(queue, flooder):
            await self._sweep_rest(flooder, sq.shard, sq.id)
        for sq in dedicated_to(queue, flooder, open_only=False):
            await call_async(lambda: self.manager.coalesce.remote(flooder.queue, sq.id))
        self._event("removed", flooder, depth=flooder.depth)

    async def _sweep_rest(self, flooder: Flooder, shard: int, target: int) -> None:
        handle = self.shards[shard]
        while await call_async(lambda: handle.spill_left.remote(flooder.type, flooder.tenant)):
            moved = await call_async(lambda: handle.sweep.remote(
                flooder.type, flooder.tenant, target, self.flood_config.sweep_batch))
            self._event("swept", flooder, shard=shard, moved=moved)

    async def _sweep(self, queues: dict[str, QueueInfo], snapshots: list[dict]) -> set:
        """Move what was spilled when this run began back, batch by batch, while each
        target queue stays healthy (what spills meanwhile waits for the next run).
        Returns the flooders whose spill this emptied (docs/flood-detection.md:
        "completely swept")."""
        # queues.get: None when the queue was deleted since this run began
        return fully_swept({f.combination: [
            await self._sweep_into(f, sq.shard, sq.id,
                                   spilled_on(snapshots[sq.shard]["tenant_counts"], f))
            for sq in dedicated_to(queues.get(f.queue), f)] for f in self.flooders})

    async def _sweep_into(self, flooder: Flooder, shard: int, target: int, spilled: int) -> bool:
        """Sweep into ``target`` on ``shard``; True when all of ``spilled`` went back."""
        handle = self.shards[shard]
        batches = 0
        while True:
            # the target queue's depth, checked before every batch
            depth, under_pressure = await call_async(lambda: handle.health.remote(target))
            step = sweep_step(depth, under_pressure, spilled, batches, self.flood_config,
                              MAX_SWEEP_BATCHES)
            if step == "pause":
                self._event("sweep paused", flooder, shard=shard, depth=depth,
                            under_pressure=under_pressure)
            if step != "sweep":
                return step == "done"
            moved = await call_async(lambda: handle.sweep.remote(
                flooder.type, flooder.tenant, target, self.flood_config.sweep_batch))
            batches += 1
            spilled = left_to_sweep(spilled, moved)
            self._event("swept", flooder, shard=shard, moved=moved)

    def _event(self, what: str, flooder: Flooder, **details) -> None:
        event = self.history.append({"at": self.clock.now(), "kind": "flood", "event": what,
                                     "queue": flooder.queue, "type": flooder.type,
                                     "tenant": flooder.tenant, **details})
        self.events.append("flood", event["at"], queue=flooder.queue, type=flooder.type,
                           tenant=flooder.tenant, outcome=what, detail=json.dumps(details))

    @signed(FLOOD_OPS["flush_events"])
    async def flush_events(self) -> int:
        return await asyncio.to_thread(self.events.flush)

    async def _detect_round(self) -> None:
        if self.flood_config.enabled:
            await self.detect_once()


FloodRemote = ray.remote(concurrency_groups=LIVENESS_GROUPS)(FloodDetector)
