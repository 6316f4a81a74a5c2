"""Bounded label sets for metrics: a metric tagged by key must not grow a time
series per tenant or job type forever."""

from __future__ import annotations

from collections.abc import Mapping

TOP_KEYS = 20
OTHER = "other"


def top_keys(values: Mapping[str, float], limit: int = TOP_KEYS) -> dict[str, float]:
    """The ``limit`` largest entries by value; the rest summed under "other"."""
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[:limit])
    rest = sum(v for _, v in ranked[limit:])
    if rest or len(ranked) > limit:
        out[OTHER] = out.get(OTHER, 0.0) + rest
    return out
