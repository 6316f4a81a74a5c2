"""FloodDetector: the flooder list, isolation, spill routing and the sweeper
(docs/flood-detection.md).

Every interval it reads each shard's counts (kept locally by the shards as
enqueues happen: no enqueue waits on the network for them), applies the
rules of :mod:`rayq.core.flood`, and then:

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
import logging
import os
import time
from dataclasses import replace

import ray

from actors import MANAGER, NAMESPACE, shard_name
from actors.consumer import unwrap
from actors.gate import durable_gate, manager_directory
from actors.metrics import BackgroundFailures, FloodMetrics
from rayq.analytics.eventlog import open_event_log
from rayq.config import Config
from rayq.core.auth import Signature
from rayq.core.flood import Flooder, build_view, detect, sweep_step
from rayq.core.history import EventHistory
from rayq.core.kv import LmdbKV
from rayq.core.model import SubqueueState, pack, unpack
from rayq.core.registry import QueueInfo
from rayq.errors import RayqError

log = logging.getLogger("rayq.flood")
MOVE_ROWS_PER_CALL = 5_000
MAX_SWEEP_BATCHES = 500   # per flooder and shard in one run: the next run goes on


class FloodDetector:
    def __init__(self, data_dir: str, config: Config):
        self.config, self.fc = config, config.flood
        self.kv = LmdbKV(os.path.join(data_dir, "flood"), map_size=64 << 20)
        self.history = EventHistory(self.kv, 1000)
        self.metrics = FloodMetrics()
        self.failures = BackgroundFailures("flood")
        self.events = open_event_log(data_dir, "flood", config.analytics)
        raw = self.kv.read(lambda txn: txn.get("meta", b"flooders"))
        self.flooders: list[Flooder] = [Flooder(**f) for f in unpack(raw)] if raw else []
        self.manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
        self.shards = [ray.get_actor(shard_name(i), namespace=NAMESPACE)
                       for i in range(config.store.shards)]
        self.gate = durable_gate(manager_directory, self.kv)
        asyncio.get_running_loop().create_task(self._detect_forever())

    async def flooders_now(self, auth: Signature | None = None) -> list[Flooder]:
        await self.gate.admin(auth, "flooders")
        return list(self.flooders)

    async def events(self, auth: Signature | None = None) -> tuple[dict, ...]:
        await self.gate.admin(auth, "flood_events")
        return self.history.recent()

    # -- one run ---------------------------------------------------------------------
    async def detect_once(self) -> list[Flooder]:
        queues: dict[str, QueueInfo] = await unwrap(self.manager.flood_layout.remote())
        snapshots = await asyncio.gather(*(s.flood_snapshot.remote() for s in self.shards))
        layout = {sq.id: (ref, bool(sq.dedicated)) for ref, q in queues.items() for sq in q.subqueues}
        view = build_view(layout, [s["tenant_counts"] for s in snapshots],
                          [s["enqueues"] for s in snapshots])
        now = time.time()
        changes = detect(view, self.flooders, self.fc, now)
        for flooder in changes.added:
            self._event("detected", flooder, depth=flooder.depth)
            await self._isolate(flooder, queues)
        flooders = [f for f in changes.kept if f.queue in queues] + list(changes.added)
        for flooder in flooders:  # subqueues added since (scaling) get a dedicated twin
            await self._dedicated(flooder, queues[flooder.queue])
        queues = await unwrap(self.manager.flood_layout.remote())  # with the new subqueues
        await self._route(queues, flooders)
        self.flooders = flooders  # published once the shards divert their puts
        for flooder in changes.removed:
            await self._release(flooder, queues)
        emptied = await self._sweep(queues, snapshots)
        self.flooders = [replace(f, swept_empty=f.combination in emptied) for f in self.flooders]
        self.kv.transact(lambda txn: txn.put("meta", b"flooders",
                                             pack([vars(f) for f in self.flooders])))
        self.metrics.update(self.flooders)
        return list(self.flooders)

    async def _isolate(self, flooder: Flooder, queues: dict[str, QueueInfo]) -> None:
        """A dedicated subqueue on every shard of the queue; visible messages move there."""
        queue = queues[flooder.queue]
        moved = 0
        for shard, target in (await self._dedicated(flooder, queue)).items():
            for source in queue.subqueues:
                if source.shard == shard and not source.dedicated:
                    moved += await self._move_all(shard, source.id, target, flooder)
        self._event("isolated", flooder, moved=moved)

    async def _dedicated(self, flooder: Flooder, queue: QueueInfo) -> dict[int, int]:
        """The flooder's dedicated subqueue on every shard its queue uses, by shard; the
        manager is asked only for shards that have none yet (e.g. after scaling)."""
        out = {sq.shard: sq.id for sq in queue.subqueues
               if sq.dedicated == (flooder.type, flooder.tenant) and sq.state is SubqueueState.ALL}
        for shard in sorted({sq.shard for sq in queue.subqueues if not sq.dedicated} - set(out)):
            sq = await unwrap(self.manager.add_dedicated.remote(
                flooder.queue, shard, flooder.type, flooder.tenant))
            out[shard] = sq.id
        return out

    async def _move_all(self, shard: int, source: int, target: int, flooder: Flooder) -> int:
        moved, cursor = 0, None
        while True:
            n, cursor = await unwrap(self.shards[shard].move_matching.remote(
                source, target, flooder.type, flooder.tenant, MOVE_ROWS_PER_CALL, cursor))
            moved += n
            if cursor is None:
                return moved

    async def _route(self, queues: dict[str, QueueInfo], flooders: list[Flooder]) -> None:
        """Tell each shard which flooders' puts to its subqueues to spill."""
        diverts: list[dict[int, list]] = [{} for _ in self.shards]
        for flooder in flooders:
            for sq in queues[flooder.queue].subqueues:
                if not sq.dedicated:
                    diverts[sq.shard].setdefault(sq.id, []).append((flooder.type, flooder.tenant))
        await asyncio.gather(*(s.set_diverts.remote(d) for s, d in zip(self.shards, diverts)))

    async def _release(self, flooder: Flooder, queues: dict[str, QueueInfo]) -> None:
        """The shards no longer spill its puts (routed before this): what it spilled
        since the last sweep (few, or it would not leave) goes back, then its dedicated
        subqueues drain and go like any retired subqueue."""
        queue = queues.get(flooder.queue)
        dedicated = [sq for sq in (queue.subqueues if queue else ())
                     if sq.dedicated == (flooder.type, flooder.tenant)]
        for sq in dedicated:
            if sq.state is SubqueueState.ALL:
                await self._sweep_rest(flooder, sq.shard, sq.id)
        for sq in dedicated:
            await unwrap(self.manager.coalesce.remote(flooder.queue, sq.id))
        self._event("removed", flooder, depth=flooder.depth)

    async def _sweep_rest(self, flooder: Flooder, shard: int, target: int) -> None:
        handle = self.shards[shard]
        while await handle.spill_left.remote(flooder.type, flooder.tenant):
            moved = await unwrap(handle.sweep.remote(flooder.type, flooder.tenant, target,
                                                     self.fc.sweep_batch))
            self._event("swept", flooder, shard=shard, moved=moved)

    async def _sweep(self, queues: dict[str, QueueInfo], snapshots: list[dict]) -> set:
        """Move what was spilled when this run began back, batch by batch, while each
        target queue stays healthy (what spills meanwhile waits for the next run).
        Returns the flooders whose spill this emptied (docs/flood-detection.md:
        "completely swept")."""
        emptied = set()
        for flooder in self.flooders:
            done = []
            queue = queues.get(flooder.queue)  # None: deleted since this run began
            for sq in queue.subqueues if queue else ():
                if sq.dedicated == (flooder.type, flooder.tenant) and sq.state is SubqueueState.ALL:
                    spilled = self._spilled_on(snapshots[sq.shard], flooder)
                    done.append(await self._sweep_into(flooder, sq.shard, sq.id, spilled))
            if done and all(done):
                emptied.add(flooder.combination)
        return emptied

    async def _sweep_into(self, flooder: Flooder, shard: int, target: int, spilled: int) -> bool:
        """Sweep into ``target`` on ``shard``; True when all of ``spilled`` went back."""
        handle = self.shards[shard]
        batches = 0
        while True:
            # the target queue's depth, checked before every batch
            depth, under_pressure = await handle.health.remote(target)
            step = sweep_step(depth, under_pressure, spilled, batches, self.fc, MAX_SWEEP_BATCHES)
            if step == "pause":
                self._event("sweep paused", flooder, shard=shard, depth=depth,
                            under_pressure=under_pressure)
            if step != "sweep":
                return step == "done"
            moved = await unwrap(handle.sweep.remote(flooder.type, flooder.tenant, target,
                                                     self.fc.sweep_batch))
            batches += 1
            spilled = spilled - moved if moved else 0  # nothing moved: the rest had expired
            self._event("swept", flooder, shard=shard, moved=moved)

    @staticmethod
    def _spilled_on(snapshot: dict, flooder: Flooder) -> int:
        return sum(n for (kind, _, type_, tenant), n in snapshot["tenant_counts"].items()
                   if kind == "S" and flooder.covers(type_, tenant))

    def _event(self, what: str, flooder: Flooder, **details) -> None:
        event = self.history.append({"at": time.time(), "kind": "flood", "event": what,
                                     "queue": flooder.queue, "type": flooder.type,
                                     "tenant": flooder.tenant, **details})
        if self.events is not None:
            self.events.append("flood", event["at"], queue=flooder.queue, type=flooder.type,
                               tenant=flooder.tenant, outcome=what, detail=json.dumps(details))

    async def flush_events(self, auth: Signature | None = None) -> int:
        await self.gate.admin(auth, "flush_events")
        return await asyncio.to_thread(self.events.flush) if self.events else 0

    async def _detect_forever(self) -> None:
        while True:
            await asyncio.sleep(self.fc.interval_s)
            if not self.fc.enabled:
                continue
            try:
                await self.detect_once()
            except (RayqError, ray.exceptions.RayError) as err:  # a shard or the manager
                self.failures.record("detection", err)  # restarting: the next run catches up
            except Exception:  # a bug must not end flood protection for good
                log.exception("flood detection failed")

    async def background_failures(self) -> dict[str, int]:
        return dict(self.failures.counts)

    async def forget_keys(self) -> None:
        self.gate.forget()

    async def ping(self) -> bool:
        return True


FloodRemote = ray.remote(FloodDetector)
