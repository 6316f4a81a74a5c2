"""Bounded label sets for metrics: a metric tagged by key must not grow a time
series per tenant or job type forever."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

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


def failure_text(err: BaseException) -> str:
    """How a background failure reads in a log line: the error, and what caused it
    (its chained or context exception) when there is one."""
    cause = err.__cause__ or err.__context__
    return f"{err!r} caused by {cause!r}" if cause else repr(err)


def per_key(depths: Iterable[Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(messages per key, the longest wait per key) over a shard's per-subqueue key
    depths (:class:`rayq.core.storage.store.KeyDepth`)."""
    depth: dict[str, float] = defaultdict(float)
    oldest: dict[str, float] = defaultdict(float)
    for d in depths:
        depth[d.key] += d.count
        oldest[d.key] = max(oldest[d.key], d.oldest_age_s)
    return dict(depth), dict(oldest)
