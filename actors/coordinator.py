"""FairnessCoordinator: usage in, listen plan out (docs/fairness-coordinator.md).

Every interval it takes the usage reports the shards keep with the ends of
deliveries (consumers send each with its end, so a report outlives its consumer), the per-key
latency snapshot of the task queues from the shards, evaluates the rules of
:mod:`rayq.core.fairness.policy` and publishes a :class:`ListenPlan` that consumers
fetch and apply when they choose which keys to receive from. Booster permits
become extra consumers (the manager starts them; on a cluster it also asks
the autoscaler). Suspension rules and every decision are persisted.
"""

from __future__ import annotations

import asyncio
import random

import ray

from actors.base import LIVENESS_GROUPS, ControlActor
from actors.metrics import CoordinatorMetrics
from rayq.analytics.eventlog import log_decision, log_report, open_event_log
from rayq.config import Config
from rayq.core.auth.operations import COORDINATOR_OPS
from rayq.core.kit.clock import Clock
from rayq.core.fairness.coordinating import (booster_consumers, fairness_report, intervening_since,
                                             is_intervening, pending_keys)
from rayq.core.fairness.policy import (Decision, FairnessReport, KeyState, ListenPlan, UsageWindows,
                                       decision_event, evaluate, listen_order)
from rayq.core.auth.gate import signed
from rayq.core.kit.history import EventHistory
from rayq.core.fairness.rules import SuspensionRule, SuspensionRules
from rayq.core.fairness.intervention import InterventionSettings, InterventionSwitch
from rayq.core.codec.tasks import Outcome, UsageReport, unpacked_reports
from rayq.core.fairness.tallies import Tally, TallyRow
from rayq.errors import InvalidMessage
from rayq.remote import answers, call_all_async, call_async, manager_link


USAGE_TAKEN = 10_000  # usage reports taken from a shard per round


class FairnessCoordinator(ControlActor):
    def __init__(self, data_dir: str, config: Config, clock: Clock | None = None,
                 start_copy=None):
        super().__init__("coordinator", data_dir, config, clock, start_copy=start_copy)
        self.fairness_config = config.fairness
        self.rules = SuspensionRules(self.kv)
        self.intervention = InterventionSwitch(self.kv, self.fairness_config)
        self.usage = UsageWindows(self.fairness_config.window_s, self.fairness_config.windows)
        self.tally = Tally()  # every finished delivery since the coordinator started
        self.metrics = CoordinatorMetrics()
        self.events = open_event_log(data_dir, "coordinator", config.analytics)
        self.manager = manager_link()
        self.decision: Decision | None = None
        self.pending: dict[str, KeyState] = {}
        self.intervening_since: float | None = None
        self.history = EventHistory(self.kv, self.fairness_config.history)
        self._version = 0
        self._regular = config.consumers.count
        self._rng = random.Random()
        self._run_every(self.fairness_config.interval_s, "evaluation", self.evaluate_once)

    # -- consumers and clients -------------------------------------------------------
    def plan(self, known_version: int | None = None) -> ListenPlan | None:
        """The current plan, or None when the caller's version is current."""
        if known_version == self._version:
            return None
        return ListenPlan(self._version, self.decision, tuple(self.pending),
                          self.rules.suspended(), self._regular, self.intervention.settings)

    @signed(COORDINATOR_OPS["report"])
    async def report(self) -> FairnessReport:
        return fairness_report(self.decision, self.pending, self._rng, self.rules.suspended(),
                               self.intervening_since, rules=tuple(self.rules.history()),
                               history=self.history.recent(), noisy=tuple(await self._noisy()),
                               intervention=self.intervention.settings)

    async def _noisy(self) -> list:
        """What every shard's fair dispatch treats as noisy (shards restarting: skipped)."""
        parts = await answers((lambda s=s: s.noisy.remote()) for s in self.shards.refresh())
        return [key for part in parts for key in part]

    @signed(COORDINATOR_OPS["suspend"])
    async def suspend(self, key: str, reason: str, by: str) -> SuspensionRule:
        rule = self.rules.suspend(key, reason, by, self.clock.now())
        self._publish({"at": rule.since, "kind": "suspend", "key": key, "reason": reason, "by": by})
        return rule

    @signed(COORDINATOR_OPS["resume"])
    async def resume(self, key: str, by: str) -> SuspensionRule | None:
        rule = self.rules.resume(key, by, self.clock.now())
        if rule is not None:
            self._publish({"at": rule.lifted_at, "kind": "resume", "key": key, "by": by})
        return rule

    @signed(COORDINATOR_OPS["set_intervention"])
    async def set_intervention(self, mode: str | None, node: str | None, enabled: bool | None,
                               by: str) -> InterventionSettings:
        """Interventions active or passive for the whole runtime (``mode``), or on or off
        on one node (``node``, ``enabled``); persisted, and in the next plan consumers
        fetch. Raises InvalidMessage for a change it cannot make."""
        now = self.clock.now()
        settings = self.intervention.change(mode, node, enabled, by, now)
        self._publish({"at": now, "kind": "intervention", "mode": settings.mode,
                       "off_nodes": sorted(settings.off_nodes), "by": by})
        if settings.passive:
            await call_async(lambda: self.manager.set_boost.remote(0))
        return settings

    # -- evaluation ----------------------------------------------------------------------
    async def evaluate_once(self) -> Decision | None:
        """Pull usage and latency, evaluate, publish; returns the decision (None when
        fairness is off)."""
        await self._pull_usage()
        concurrency, subqueues = await call_async(lambda: self.manager.fairness_inputs.remote())
        self.pending = await self._pending(subqueues, concurrency)
        self._regular = await call_async(lambda: self.manager.consumer_count.remote())
        threads = max(1, self._regular * self.config.consumers.max_load)
        now = self.clock.now()
        if not self.fairness_config.enabled:  # plain FIFO dispatch; suspensions still hold
            self._version += 1
            return None
        was_intervening = is_intervening(self.decision)
        decision = evaluate(self.usage.table(now), self.pending, now, self.fairness_config, threads,
                            self.rules.suspended(), was_intervening=was_intervening)
        self.intervening_since = intervening_since(self.decision, decision,
                                                   self.intervening_since, now)
        self.metrics.decided(decision, decision.intervening and not was_intervening,
                             dict(decision.actual_s))
        self.decision = decision
        order = listen_order(decision, self.pending, self._rng, self.rules.suspended())
        passive = self.intervention.settings.passive
        boosters = booster_consumers(decision.permits, self.config.consumers.max_load,
                                     self.fairness_config.max_boost_consumers)
        self._publish(decision_event(decision, order, passive, boosters))
        # passive: what it would do is recorded above, and no booster starts
        await call_async(lambda: self.manager.set_boost.remote(0 if passive else boosters))
        return decision

    async def _pull_usage(self) -> None:
        """Take the usage reports the shards keep with the ends of deliveries (a shard
        failing over is left out: its reports come next round)."""
        for batch in await answers((lambda s=s: s.take_usage.remote(USAGE_TAKEN))
                                   for s in self.shards.refresh()):  # added ones too
            reports, malformed = unpacked_reports(batch)
            if malformed:
                self.failures.record("usage reports", InvalidMessage(
                    f"{malformed} malformed usage reports skipped"))
            self.absorb(reports)

    def absorb(self, reports: list[UsageReport]) -> None:
        """Count usage reports: fair usage, tallies, metrics and the event log."""
        for r in reports:
            self.usage.add(r.key, r.usage_s, r.outcome is Outcome.DEFERRED, r.finished_at)
            self.tally.add(r)
            self.metrics.reported(r)
            log_report(self.events, r)

    @signed(COORDINATOR_OPS["task_stats"])
    async def task_stats(self, by: str | None = None) -> list[TallyRow]:
        """Finished deliveries per (tenant, type), tenant or type, up to now."""
        await self._pull_usage()
        return self.tally.rows(by)

    async def _pending(self, subqueues: dict[int, list[int]],
                       concurrency: dict[str, int]) -> dict[str, KeyState]:
        """Per key over the task queues: the longest wait and the oldest enqueue."""
        parts = await call_all_async((lambda i=i: self.shards[i].depths.remote())
                                     for i in sorted(subqueues))
        wanted = {sq for ids in subqueues.values() for sq in ids}
        return pending_keys((d for part in parts for d in part), wanted, concurrency)

    def _publish(self, event: dict) -> None:
        self.history.append(event)
        self._version += 1
        log_decision(self.events, event)

    @signed(COORDINATOR_OPS["flush_events"])
    async def flush_events(self) -> int:
        await self._pull_usage()
        return await asyncio.to_thread(self.events.flush)


CoordinatorRemote = ray.remote(concurrency_groups=LIVENESS_GROUPS)(FairnessCoordinator)
