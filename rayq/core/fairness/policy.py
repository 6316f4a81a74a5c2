"""Equitable thread time for fairness keys: usage, victims, listen order.

The rules and their source text: docs/fairness-coordinator.md.

Usage (handler wall time) is summed per key in a fixed circular array of
windows: ``windows`` + 1 of them, the current one in part and the oldest counted in
part (the share of it inside the look-back), so the look-back is always exactly
``window_s`` x ``windows`` (the source's 30 minutes), not 25 to 30. A key's *time span of interest* starts when its oldest queued
message was enqueued (bounded by the look-back): it is not charged for usage
from before it had to wait. In each window, the thread time used by the keys
competing then is shared among them in proportion to the fraction of the
window each spent waiting; a key's *fair expected usage* is its share summed
over its span. Keys without pending messages take no part, so they never make
others look greedy, and the shares follow capacity because they are shares
of what was actually used.

- latency: the age of a key's oldest visible message, since it was enqueued (the
  source's "age of the oldest job"; ``latency_since = "visible"`` counts only from
  when it became visible, leaving out delays and retry back-offs);
- latency victims: the oldest message waited at least the threshold (the source's
  example intervenes at exactly 20:00; scaled up by threads / limit for
  concurrency-limited keys);
- usage victims: actual < (1 - band) x expected; offenders: actual >
  (1 + band) x expected; starvation = (expected - actual) / expected;
- intervene only while some key is both a latency and a usage victim (the
  ``intervention_hysteresis`` setting, off by default, keeps an intervention on
  while a latency victim is below its fair share at all);
- zero-latency keys that used threads in the two most recent windows and
  more than a waiting key's fair share compete too (the long-running trickle);
- a usage victim whose messages were deferred (concurrency limits, host
  pressure, suspension, messages that cannot run) has its expected usage
  scaled by processed / dequeued, never below its actual usage: the revision
  can make a victim a fair user, never an offender, and only victims are
  revised (other keys' shares are left as they are);
- keys with high latency get booster permits: extra consumer capacity that
  serves them first; offenders' permits are ignored while intervening, and
  keys that deferred get none.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from rayq.config import FairnessConfig
from rayq.core.fairness.intervention import InterventionSettings
from rayq.core.kit.windows import WindowedSums

RECENT_WINDOWS = 2     # "the current or previous window" of the zero-latency rule
MAX_PERMITS = 4        # per key: permits grow with latency / threshold up to this


@dataclass(frozen=True)
class KeyState:
    """A pending key as the shards see it: how long its oldest visible message has
    waited since it became visible (0: none is visible), when its oldest message could
    first be received (its enqueue, or the end of the delay it was sent with: latency
    starts there), and its concurrency limit if any."""

    key: str
    latency_s: float
    oldest_enqueued_at: float
    concurrency: int | None = None


@dataclass(frozen=True)
class UsageTable:
    """Per key and window (oldest first; the last is the current one): handler
    seconds, messages processed and messages deferred. ``lookback_start``: where the
    look-back begins, inside the oldest window, whose sums are then already scaled to
    the part of it after that (None: every window counts whole)."""

    window_s: float
    first_window_start: float
    usage: Mapping[str, list[float]]
    processed: Mapping[str, list[float]] = field(default_factory=dict)
    deferred: Mapping[str, list[float]] = field(default_factory=dict)
    lookback_start: float | None = None

    @property
    def windows(self) -> int:
        return len(next(iter(self.usage.values()), [])) or 1

    def series(self, table: str, key: str, windows: int) -> list[float]:
        return list(getattr(self, table).get(key) or [0.0] * windows)


class UsageWindows:
    """The coordinator's running sums, fed by consumers' usage reports."""

    def __init__(self, window_s: float, windows: int):
        self.window_s, self.windows = window_s, windows
        # one window more than the look-back holds: the current one is in part, so the
        # oldest is needed in part too (see :meth:`table`)
        self._usage = WindowedSums(window_s, windows + 1)
        self._processed = WindowedSums(window_s, windows + 1)
        self._deferred = WindowedSums(window_s, windows + 1)

    def add(self, key: str, usage_s: float, deferred: bool, at: float) -> None:
        if deferred:
            self._deferred.add(key, 1, at)
        else:
            self._usage.add(key, usage_s, at)
            self._processed.add(key, 1, at)

    def table(self, now: float) -> UsageTable:
        """The sums over the look-back ``window_s`` x ``windows`` up to ``now``: the
        current window's elapsed part, the full windows before it, and of the oldest
        window the share inside the look-back (its sums scaled by that share, as if
        spread evenly over the window)."""
        current = self._usage.epoch(now)
        start = (current - self.windows) * self.window_s
        oldest_part = 1.0 - (now - current * self.window_s) / self.window_s
        usage, processed, deferred = (_oldest_scaled(sums.snapshot(now), oldest_part)
                                      for sums in (self._usage, self._processed, self._deferred))
        for key in deferred:
            usage.setdefault(key, [0.0] * (self.windows + 1))
        return UsageTable(self.window_s, start, usage, processed, deferred,
                          lookback_start=now - self.window_s * self.windows)


def _oldest_scaled(series: dict[str, list[float]], part: float) -> dict[str, list[float]]:
    """``series`` with each oldest entry scaled by ``part``."""
    return {key: [s[0] * part, *s[1:]] for key, s in series.items()}


@dataclass(frozen=True)
class Decision:
    """One evaluation: who waits, who is starved, who takes too much, and what to do."""

    at: float
    intervening: bool
    latency_victims: frozenset[str]
    usage_victims: frozenset[str]
    offenders: frozenset[str]
    fair_users: frozenset[str]
    zero_latency: tuple[str, ...]           # pending keys listed first while intervening
    expected_s: Mapping[str, float]
    actual_s: Mapping[str, float]
    starvation: Mapping[str, float]
    permits: Mapping[str, int]              # effective booster permits
    ignored_permits: Mapping[str, int]      # offenders' permits, ignored while intervening

    @property
    def victims(self) -> frozenset[str]:
        return self.latency_victims & self.usage_victims


# -- the pieces ------------------------------------------------------------------
def key_latency(state: KeyState, now: float, since: str) -> float:
    """How long a key has waited by ``since``: "enqueue", the age of its oldest message
    while one is visible (the source's measure), or "visible", how long its oldest
    visible message has been visible."""
    if since == "visible" or state.latency_s <= 0:
        return state.latency_s
    return max(state.latency_s, now - state.oldest_enqueued_at)


def latency_threshold(state: KeyState, base_s: float, threads: int) -> float:
    """A concurrency-limited key waits by its own choice: scale by threads / limit."""
    if state.concurrency and 0 < state.concurrency < threads:
        return base_s * threads / state.concurrency
    return base_s


def waiting_fractions(start: float, table: UsageTable, now: float) -> list[float]:
    """Per window: the fraction of its part in the look-back (elapsed, and after
    ``table.lookback_start``) the key spent waiting since ``start``."""
    out = []
    for j in range(table.windows):
        lo = table.first_window_start + j * table.window_s
        hi = min(lo + table.window_s, now)
        if table.lookback_start is not None:
            lo = max(lo, table.lookback_start)
        span = hi - lo
        out.append(0.0 if span <= 0 else max(0.0, min(1.0, (hi - max(lo, start)) / span)))
    return out


def deferral_scale(key: str, table: UsageTable) -> list[float]:
    """processed / dequeued per window (dequeued = processed + deferred): a key that
    throttled itself chose to use only that part of the threads it was offered."""
    n = table.windows
    processed, deferred = table.series("processed", key, n), table.series("deferred", key, n)
    return [p / (p + d) if d else 1.0 for p, d in zip(processed, deferred)]


def revised_expected(shares: list[float], actual_s: float, scale: list[float]) -> float:
    """A usage victim's expected usage after its deferrals: each window's share scaled
    by processed / dequeued, but never below what it used (the source text: the revision
    never turns a victim into an offender)."""
    return max(sum(share * f for share, f in zip(shares, scale)), actual_s)


def starvation_of(expected_s: float, actual_s: float) -> float:
    """(expected - actual) / expected: > 0 below the fair share, < 0 above it."""
    return (expected_s - actual_s) / expected_s


def fair_shares(fractions: Mapping[str, list[float]], table: UsageTable,
                weight: Callable[[str], float] = lambda key: 1.0) -> dict[str, list[float]]:
    """Expected usage per key per window: the window's usage by the competing keys,
    shared in proportion to the fractions of the window they spent waiting, times
    their weights (a key of weight 2 is entitled to twice the thread time)."""
    n = table.windows
    shares = {key: [0.0] * n for key in fractions}
    for j in range(n):
        members = [k for k, f in fractions.items() if f[j] > 0]
        f_sum = sum(fractions[k][j] * weight(k) for k in members)
        used = sum(table.series("usage", k, n)[j] for k in members)
        for k in members:
            shares[k][j] = used * fractions[k][j] * weight(k) / f_sum
    return shares


def key_weight(config: FairnessConfig) -> Callable[[str], float]:
    """A key's weight under ``config`` (``weights``, else ``default_weight``)."""
    weights = dict(config.weights)
    return lambda key: weights.get(key, config.default_weight)


def recent_run(series: list[float]) -> list[int]:
    """Window indexes of a zero-latency key's recent run of usage: it must have used
    threads in one of the two most recent windows; earlier windows count while
    usage stays non-zero without a gap."""
    n = len(series)
    if not any(series[-RECENT_WINDOWS:]):
        return []
    j = n - 1 if series[-1] else n - 2
    run = []
    while j >= 0 and series[j] > 0:
        run.append(j)
        j -= 1
    return sorted(run)


# -- the evaluation -------------------------------------------------------------
def evaluate(table: UsageTable, pending: Mapping[str, KeyState], now: float,
             config: FairnessConfig, threads: int,
             suspended: Collection[str] = (), was_intervening: bool = False) -> Decision:
    """Classify every key and decide whether to intervene (see the module docstring).

    The coordinator intervenes while a latency victim (waited at least the
    threshold) is a usage victim (:func:`intervenes`).
    """
    waiting = {k: replace(s, latency_s=key_latency(s, now, config.latency_since))
               for k, s in pending.items() if k not in suspended and s.latency_s > 0}
    fractions = {key: waiting_fractions(state.oldest_enqueued_at, table, now)
                 for key, state in waiting.items()}
    weight = key_weight(config)
    first = fair_shares(fractions, table, weight)
    n = table.windows
    # Zero-latency keys: pending with nothing waiting, or finished recently.
    zero = sorted((set(table.usage) | set(pending)) - set(waiting) - set(suspended))
    competing = dict(fractions)
    for key in zero:
        run = recent_run(table.series("usage", key, n))
        used = sum(table.series("usage", key, n)[j] for j in run)
        least_fair = min((sum(first[k][j] for j in run) for k in waiting), default=math.inf)
        if run and used > least_fair:
            competing[key] = [1.0 if j in run else 0.0 for j in range(n)]
    shares = fair_shares(competing, table, weight) if len(competing) > len(fractions) else first
    expected, actual, starvation = {}, {}, {}
    for key, f in competing.items():
        usage = table.series("usage", key, n)
        expected[key] = sum(shares[key])
        actual[key] = sum(u for u, w in zip(usage, f) if w > 0)
        if expected[key] > 0:
            starvation[key] = starvation_of(expected[key], actual[key])
        if starvation.get(key, 0.0) > config.band and any(table.series("deferred", key, n)):
            expected[key] = revised_expected(shares[key], actual[key], deferral_scale(key, table))
            starvation[key] = starvation_of(expected[key], actual[key]) if expected[key] else 0.0
    usage_victims = frozenset(k for k, s in starvation.items() if s > config.band)
    offenders = frozenset(k for k, s in starvation.items() if s < -config.band)
    latency_victims = frozenset(
        k for k, s in waiting.items()
        if s.latency_s >= latency_threshold(s, config.latency_threshold_s, threads))
    intervening = intervenes(latency_victims, usage_victims, starvation, was_intervening,
                             config.intervention_hysteresis)
    permits, ignored = booster_permits(waiting, table, config, threads, offenders if intervening else ())
    return Decision(
        at=now, intervening=intervening, latency_victims=latency_victims,
        usage_victims=usage_victims, offenders=offenders,
        fair_users=frozenset(starvation) - usage_victims - offenders,
        zero_latency=tuple(k for k in zero if k in pending and k not in competing),
        expected_s=expected, actual_s=actual, starvation=starvation,
        permits=permits, ignored_permits=ignored)


def intervenes(latency_victims: Collection[str], usage_victims: Collection[str],
               starvation: Mapping[str, float], was_intervening: bool,
               hysteresis: bool) -> bool:
    """Whether to intervene: while some key is both a latency and a usage victim (the
    source text's rule). With ``hysteresis``, an intervention already on also goes on
    while a latency victim is below its fair share at all (starvation > 0), so that
    stopping at the band does not hand the threads straight back to the offender."""
    if set(latency_victims) & set(usage_victims):
        return True
    return hysteresis and was_intervening and any(
        starvation.get(k, 0.0) > 0 for k in latency_victims)


def booster_permits(waiting: Mapping[str, KeyState], table: UsageTable, config: FairnessConfig,
                    threads: int, offenders: Collection[str]) -> tuple[dict, dict]:
    """Permits for keys over their latency threshold, more for longer waits. Keys that
    deferred messages get none; offenders' permits are set aside as ignored."""
    permits, ignored = {}, {}
    for key, state in waiting.items():
        threshold = latency_threshold(state, config.latency_threshold_s, threads)
        if state.latency_s < threshold or any(table.series("deferred", key, table.windows)):
            continue
        count = min(MAX_PERMITS, int(state.latency_s // threshold))
        (ignored if key in offenders else permits)[key] = count
    return permits, ignored


def current_starvation(decision: Decision, key: str, spent: Mapping[str, float]) -> float:
    """A key's starvation after ``spent`` more seconds of usage since the decision."""
    expected = decision.expected_s.get(key, 0.0)
    if expected <= 0:
        return decision.starvation.get(key, 0.0)
    return (expected - decision.actual_s.get(key, 0.0) - spent.get(key, 0.0)) / expected


def listen_order(decision: Decision | None, keys: Collection[str], rng: random.Random,
                 suspended: Collection[str] = (), booster: bool = False,
                 spent: Mapping[str, float] | None = None) -> list[str]:
    """The order a consumer asks for keys in, built afresh for each receive.

    Without intervention: a random shuffle, so every key has the same chance.
    While intervening: zero-latency keys first (shuffled), then the others by
    decreasing starvation, brought up to date with the usage ``spent`` since
    the decision (so the most starved key does not take every thread until the
    next evaluation). A ``booster`` (capacity added for permits) puts the keys
    holding permits in front, most permits first. Suspended keys are left out.
    """
    keys = [k for k in dict.fromkeys(keys) if k not in suspended]
    rng.shuffle(keys)
    if decision is not None and decision.intervening:
        spent = spent or {}
        zero = [k for k in keys if k in decision.zero_latency]
        starved = sorted((k for k in keys if k not in decision.zero_latency),
                         key=lambda k: -current_starvation(decision, k, spent))
        keys = zero + starved
    if not booster or decision is None:
        return keys
    permitted = sorted((k for k in keys if k in decision.permits),
                       key=lambda k: -decision.permits[k])
    return permitted + [k for k in keys if k not in decision.permits]


@dataclass(frozen=True)
class ListenPlan:
    """What the coordinator publishes to consumers: the latest decision, the keys
    with pending messages, the suspended keys, how many consumers are regular
    (consumers with a higher index are boosters, added for permits), and whether
    interventions act (passive: none does; a consumer on a node where intervention
    is off ignores the order)."""

    version: int
    decision: Decision | None
    keys: tuple[str, ...]
    suspended: frozenset[str]
    regular_consumers: int
    intervention: InterventionSettings = InterventionSettings()


@dataclass(frozen=True)
class FairnessReport:
    """``client.fairness()``: the state of fair dispatch at the last evaluation.

    starvation: (expected - actual) / expected per key; listen_order: while
    intervening, the order a regular consumer asks for keys in now; outside an
    intervention a shuffle that consumers do not follow (they leave the order to the
    shards' fair dispatch, docs/fairness-coordinator.md); history: recent decisions, newest last;
    noisy: the keys the shards' fair dispatch treats as noisy (first layer), since when;
    intervention: the mode and the nodes where intervention is off. While ``passive``,
    ``intervening``, the permits and the history's decisions say what the coordinator
    would do; consumers' listen order and the booster count are left as they were.
    """

    evaluated_at: float | None
    intervening: bool
    intervening_since: float | None
    victims: frozenset[str]
    latency_victims: frozenset[str]
    usage_victims: frozenset[str]
    offenders: frozenset[str]
    fair_users: frozenset[str]
    starvation: Mapping[str, float]
    expected_s: Mapping[str, float]
    actual_s: Mapping[str, float]
    listen_order: tuple[str, ...]
    permits: Mapping[str, int]
    ignored_permits: Mapping[str, int]
    suspended: tuple
    history: tuple[dict, ...]
    noisy: tuple = ()   # rayq.core.storage.dispatch.NoisyKey: what the shards' fair dispatch serves last
    intervention: InterventionSettings = InterventionSettings()

    @property
    def passive(self) -> bool:
        return self.intervention.passive


def decision_event(d: Decision, order: list[str], passive: bool = False,
                   boosters: int = 0) -> dict:
    """A decision as a plain record for the event log; ``passive``: recorded only, it
    changed nothing (``boosters``: the booster consumers its permits ask for, started
    unless passive)."""
    return {"at": d.at, "kind": "fairness", "intervening": d.intervening,
            "passive": passive, "boosters": boosters,
            "victims": sorted(d.victims), "latency_victims": sorted(d.latency_victims),
            "usage_victims": sorted(d.usage_victims), "offenders": sorted(d.offenders),
            "starvation": {k: round(v, 4) for k, v in d.starvation.items()},
            "permits": dict(d.permits), "ignored_permits": dict(d.ignored_permits),
            "listen_order": order}
