"""What the fairness coordinator counts of ended deliveries: per (tenant, type), the
outcomes, the usage and a bounded sample of waits with their percentiles."""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from rayq.core.codec.tasks import DeferralCause, Outcome, UsageReport
from rayq.errors import InvalidMessage


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0..100) of sorted values; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class TallyRow:
    """Per (tenant, type): finished deliveries by outcome, usage and wait percentiles."""

    tenant: str
    type: str
    succeeded: int
    failed: int
    dead: int
    deferred: int
    usage_s: float
    wait_p50_s: float
    wait_p99_s: float
    deferred_by_cause: Mapping[str, int] = field(default_factory=dict)  # cause -> count


def _cause_column(cause: DeferralCause) -> str:
    return f"deferred:{cause.value}"


_COUNTED = [o.value for o in Outcome] + ["usage_s"] + [_cause_column(c) for c in DeferralCause]


class Tally:
    """Counts per (tenant, type) with a bounded reservoir of wait samples."""

    def __init__(self, samples: int = 4096, seed: int = 0):
        self._counts: dict[tuple[str, str], dict[str, float]] = {}
        self._waits: dict[tuple[str, str], list[float]] = {}
        self._seen: dict[tuple[str, str], int] = {}
        self._samples, self._rng = samples, random.Random(seed)

    def add(self, report: UsageReport) -> None:
        who = (report.tenant, report.type)
        counts = self._counts.setdefault(who, dict.fromkeys(_COUNTED, 0.0))
        counts[report.outcome.value] += 1
        if report.outcome is Outcome.DEFERRED:
            counts[_cause_column(report.cause or DeferralCause.CONCURRENCY)] += 1
        counts["usage_s"] += report.usage_s
        if report.outcome is not Outcome.DEFERRED:
            self._sample(who, report.wait_s)

    def _sample(self, who: tuple[str, str], wait_s: float) -> None:
        waits = self._waits.setdefault(who, [])
        seen = self._seen[who] = self._seen.get(who, 0) + 1
        if len(waits) < self._samples:
            bisect.insort(waits, wait_s)
        elif (slot := self._rng.randrange(seen)) < self._samples:  # reservoir sampling
            del waits[slot]
            bisect.insort(waits, wait_s)

    def rows(self, by: str | None = None) -> list[TallyRow]:
        """One row per (tenant, type), or per tenant (``by="tenant"``) or type (``"type"``);
        a grouped row has ``"*"`` in the other field."""
        if by not in (None, "tenant", "type"):
            raise InvalidMessage(f"rows(by=) takes None, 'tenant' or 'type', not {by!r}")
        groups: dict[tuple[str, str], tuple[dict, list[float]]] = {}
        for (tenant, type_), counts in self._counts.items():
            group = (tenant if by != "type" else "*", type_ if by != "tenant" else "*")
            total, waits = groups.setdefault(group, (dict.fromkeys(counts, 0.0), []))
            for name, n in counts.items():
                total[name] += n
            waits.extend(self._waits.get((tenant, type_), []))
        out = []
        for (tenant, type_), (c, waits) in sorted(groups.items()):
            waits.sort()
            out.append(TallyRow(tenant, type_, int(c["succeeded"]), int(c["failed"]),
                                int(c["dead"]), int(c["deferred"]), c["usage_s"],
                                percentile(waits, 50), percentile(waits, 99),
                                {cause.value: int(c[_cause_column(cause)])
                                 for cause in DeferralCause if c[_cause_column(cause)]}))
        return out
