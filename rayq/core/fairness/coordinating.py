"""What the fairness coordinator decides around :func:`rayq.core.fairness.policy.evaluate`,
as functions of what it pulled and ``now``: the pending keys from the shards' depths,
since when it intervenes, how many booster consumers the permits ask for, and the
report ``client.fairness()`` returns."""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from rayq.core.fairness.intervention import InterventionSettings
from rayq.core.fairness.policy import Decision, FairnessReport, KeyState, listen_order
from rayq.core.codec.model import KeyDepth


def pending_keys(depths: Iterable[KeyDepth], subqueues: Collection[int],
                 concurrency: Mapping[str, int]) -> dict[str, KeyState]:
    """Per key over ``subqueues`` (the task queues'): the longest wait and the oldest
    message's time it could first be received (its enqueue, or the end of its delay),
    of the subqueues where it has messages, with its concurrency limit."""
    pending: dict[str, KeyState] = {}
    for d in depths:
        if d.subqueue not in subqueues or d.count <= 0 or d.oldest_enqueued_at is None:
            continue
        old = pending.get(d.key)
        latency = max(d.latency_s, old.latency_s if old else 0.0)
        ready = d.oldest_enqueued_at if d.oldest_ready_at is None else d.oldest_ready_at
        oldest = min(ready, old.oldest_enqueued_at if old else float("inf"))
        pending[d.key] = KeyState(d.key, latency, oldest, concurrency.get(d.key))
    return pending


def is_intervening(decision: Decision | None) -> bool:
    return decision is not None and decision.intervening


def intervening_since(before: Decision | None, after: Decision, since: float | None,
                      now: float) -> float | None:
    """When the intervention ``after`` belongs to began: ``now`` if it starts now,
    ``since`` if it goes on, None once it stopped."""
    if not after.intervening:
        return None
    return since if is_intervening(before) else now


def booster_consumers(permits: Mapping[str, int], max_load: int, max_boost: int) -> int:
    """Extra consumers for booster permits: one per ``max_load`` permits (a consumer
    runs up to that many tasks), at most ``max_boost``."""
    return min(max_boost, -(-sum(permits.values()) // max_load))


def fairness_report(decision: Decision | None, pending: Collection[str], rng: random.Random,
                    suspended: Collection[str], intervening_since_: float | None, *,
                    rules: tuple, history: tuple[dict, ...], noisy: tuple,
                    intervention: InterventionSettings = InterventionSettings()) -> FairnessReport:
    """``client.fairness()`` from the last decision (None: none yet, an empty report)."""
    order = tuple(listen_order(decision, pending, rng, suspended))
    return FairnessReport(
        evaluated_at=decision.at if decision else None, intervening=is_intervening(decision),
        intervening_since=intervening_since_, listen_order=order, suspended=rules,
        history=history, noisy=noisy, intervention=intervention, **_decision_fields(decision))


def _decision_fields(decision: Decision | None) -> dict[str, Any]:
    """The report's fields copied from ``decision`` (empty ones without a decision)."""
    sets = ("victims", "latency_victims", "usage_victims", "offenders", "fair_users")
    maps = ("starvation", "expected_s", "actual_s", "permits", "ignored_permits")
    if decision is None:
        return {**{name: frozenset() for name in sets}, **{name: {} for name in maps}}
    return {**{name: getattr(decision, name) for name in sets},
            **{name: dict(getattr(decision, name)) for name in maps}}
