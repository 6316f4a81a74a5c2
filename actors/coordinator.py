"""FairnessCoordinator: usage in, listen plan out (docs/fairness-coordinator.md).

Every interval it pulls the usage reports consumers buffered, the per-key
latency snapshot of the task queues from the shards, evaluates the rules of
:mod:`rayq.core.fairness` and publishes a :class:`ListenPlan` that consumers
fetch and apply when they choose which keys to receive from. Booster permits
become extra consumers (the manager starts them; on a cluster it also asks
the autoscaler). Suspension rules and every decision are persisted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time

import ray

from actors import MANAGER, NAMESPACE, shard_name
from actors.consumer import named_consumers, unwrap
from actors.gate import durable_gate, manager_directory
from actors.metrics import BackgroundFailures, CoordinatorMetrics
from rayq.analytics.eventlog import log_report, open_event_log
from rayq.config import Config
from rayq.core.auth import Signature
from rayq.core.fairness import (Decision, FairnessReport, KeyState, ListenPlan, UsageWindows,
                                decision_event, evaluate, listen_order)
from rayq.core.history import EventHistory
from rayq.core.kv import LmdbKV
from rayq.core.rules import SuspensionRule, SuspensionRules
from rayq.core.tasks import Outcome, Tally, TallyRow, UsageReport
from rayq.errors import RayqError

log = logging.getLogger("rayq.coordinator")


class FairnessCoordinator:
    def __init__(self, data_dir: str, config: Config):
        self.config, self.fc = config, config.fairness
        self.kv = LmdbKV(os.path.join(data_dir, "coordinator"), map_size=64 << 20)
        self.rules = SuspensionRules(self.kv)
        self.usage = UsageWindows(self.fc.window_s, self.fc.windows)
        self.tally = Tally()  # every finished delivery since the coordinator started
        self.metrics = CoordinatorMetrics()
        self.failures = BackgroundFailures("coordinator")
        self.events = open_event_log(data_dir, "coordinator", config.analytics)
        self.manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
        self.shards = [ray.get_actor(shard_name(i), namespace=NAMESPACE)
                       for i in range(config.store.shards)]
        self.decision: Decision | None = None
        self.pending: dict[str, KeyState] = {}
        self.intervening_since: float | None = None
        self.history = EventHistory(self.kv, self.fc.history)
        self._version = 0
        self._regular = config.consumers.count
        self._rng = random.Random()
        self.gate = durable_gate(manager_directory, self.kv)
        asyncio.get_running_loop().create_task(self._evaluate_forever())

    # -- consumers and clients -------------------------------------------------------
    def plan(self, known_version: int | None = None) -> ListenPlan | None:
        """The current plan, or None when the caller's version is current."""
        if known_version == self._version:
            return None
        return ListenPlan(self._version, self.decision, tuple(self.pending),
                          self.rules.suspended(), self._regular)

    async def report(self, auth: Signature | None = None) -> FairnessReport:
        await self.gate.admin(auth, "fairness")
        d = self.decision
        order = tuple(listen_order(d, self.pending, self._rng, self.rules.suspended()))
        empty: frozenset[str] = frozenset()
        return FairnessReport(
            evaluated_at=d.at if d else None, intervening=bool(d and d.intervening),
            intervening_since=self.intervening_since,
            victims=d.victims if d else empty, latency_victims=d.latency_victims if d else empty,
            usage_victims=d.usage_victims if d else empty, offenders=d.offenders if d else empty,
            fair_users=d.fair_users if d else empty, starvation=dict(d.starvation) if d else {},
            expected_s=dict(d.expected_s) if d else {}, actual_s=dict(d.actual_s) if d else {},
            listen_order=order, permits=dict(d.permits) if d else {},
            ignored_permits=dict(d.ignored_permits) if d else {},
            suspended=tuple(self.rules.history()), history=self.history.recent(),
            noisy=tuple(await self._noisy()))

    async def _noisy(self) -> list:
        """What every shard's fair dispatch treats as noisy (shards restarting: skipped)."""
        parts = await asyncio.gather(*(s.noisy.remote() for s in self.shards),
                                     return_exceptions=True)
        return [k for part in parts if not isinstance(part, BaseException) for k in part]

    async def suspend(self, key: str, reason: str, by: str,
                      auth: Signature | None = None) -> SuspensionRule:
        await self.gate.admin(auth, "suspend", key, reason, by)
        rule = self.rules.suspend(key, reason, by, time.time())
        self._publish({"at": rule.since, "kind": "suspend", "key": key, "reason": reason, "by": by})
        return rule

    async def resume(self, key: str, by: str,
                     auth: Signature | None = None) -> SuspensionRule | None:
        await self.gate.admin(auth, "resume", key, by)
        rule = self.rules.resume(key, by, time.time())
        if rule is not None:
            self._publish({"at": rule.lifted_at, "kind": "resume", "key": key, "by": by})
        return rule

    # -- evaluation ----------------------------------------------------------------------
    async def evaluate_once(self) -> Decision | None:
        """Pull usage and latency, evaluate, publish; returns the decision (None when
        fairness is off)."""
        await self._pull_usage()
        concurrency, subqueues = await unwrap(self.manager.fairness_inputs.remote())
        self.pending = await self._pending(subqueues, concurrency)
        self._regular = await unwrap(self.manager.consumer_count.remote())
        threads = max(1, self._regular * self.config.consumers.max_load)
        now = time.time()
        if not self.fc.enabled:  # plain FIFO dispatch; suspensions still hold
            self._version += 1
            return None
        decision = evaluate(self.usage.table(now), self.pending, now, self.fc, threads,
                            self.rules.suspended(),
                            was_intervening=bool(self.decision and self.decision.intervening))
        started = decision.intervening and not (self.decision and self.decision.intervening)
        if started:
            self.intervening_since = now
        elif not decision.intervening:
            self.intervening_since = None
        self.metrics.decided(decision, started, dict(decision.actual_s))
        self.decision = decision
        order = listen_order(decision, self.pending, self._rng, self.rules.suspended())
        self._publish(decision_event(decision, order))
        await self._boost(decision)
        return decision

    async def _pull_usage(self) -> None:
        consumers = list(named_consumers().values())
        batches = await asyncio.gather(*(c.drain_reports.remote() for c in consumers),
                                       return_exceptions=True)
        for batch in batches:
            if isinstance(batch, BaseException):
                continue  # a consumer restarting: its next reports come next round
            self.absorb(batch)

    def absorb(self, reports: list[UsageReport]) -> None:
        """Take usage reports (pulled, or handed over by a consumer that stops)."""
        for r in reports:
            self.usage.add(r.key, r.usage_s, r.outcome is Outcome.DEFERRED, r.finished_at)
            self.tally.add(r)
            self.metrics.reported(r)
            if self.events is not None:
                log_report(self.events, r)

    async def task_stats(self, by: str | None = None,
                         auth: Signature | None = None) -> list[TallyRow]:
        """Finished deliveries per (tenant, type), tenant or type, up to now."""
        await self.gate.admin(auth, "task_stats", by)
        await self._pull_usage()
        return self.tally.rows(by)

    async def _pending(self, subqueues: dict[int, list[int]],
                       concurrency: dict[str, int]) -> dict[str, KeyState]:
        """Per key over the task queues: the longest wait and the oldest enqueue."""
        shards = sorted(subqueues)
        depths = await asyncio.gather(*(self.shards[i].depths.remote() for i in shards))
        wanted = {sq for i in shards for sq in subqueues[i]}
        pending: dict[str, KeyState] = {}
        for part in depths:
            for d in part:
                if d.subqueue not in wanted or d.count <= 0 or d.oldest_enqueued_at is None:
                    continue
                old = pending.get(d.key)
                latency = max(d.latency_s, old.latency_s if old else 0.0)
                oldest = min(d.oldest_enqueued_at, old.oldest_enqueued_at if old else float("inf"))
                pending[d.key] = KeyState(d.key, latency, oldest, concurrency.get(d.key))
        return pending

    async def _boost(self, decision: Decision) -> None:
        """Permits become booster consumers: one per max_load permits, bounded."""
        permits = sum(decision.permits.values())
        per = self.config.consumers.max_load
        extra = min(self.fc.max_boost_consumers, -(-permits // per))
        await unwrap(self.manager.set_boost.remote(extra))

    def _publish(self, event: dict) -> None:
        self.history.append(event)
        self._version += 1
        if self.events is not None and event["kind"] == "fairness":
            self.events.append("fairness", event["at"], detail=json.dumps(event),
                               outcome="intervening" if event["intervening"] else "fair")

    async def flush_events(self, auth: Signature | None = None) -> int:
        await self.gate.admin(auth, "flush_events")
        await self._pull_usage()
        return await asyncio.to_thread(self.events.flush) if self.events else 0

    async def _evaluate_forever(self) -> None:
        while True:
            await asyncio.sleep(self.fc.interval_s)
            try:
                await self.evaluate_once()
            except (RayqError, ray.exceptions.RayError) as err:  # a shard or the manager
                self.failures.record("evaluation", err)  # restarting: evaluate next round
            except Exception:  # a bug must not stop fair dispatch for good: log, go on
                log.exception("fairness evaluation failed")

    async def background_failures(self) -> dict[str, int]:
        return dict(self.failures.counts)

    async def forget_keys(self) -> None:
        self.gate.forget()

    async def ping(self) -> bool:
        return True


CoordinatorRemote = ray.remote(FairnessCoordinator)
