"""Where new subqueues go: a pure choice over the shards' depths (docs/autoscaling.md)."""

from __future__ import annotations

from collections.abc import Mapping


def least_loaded_shard(shard_depths: Mapping[int, int]) -> int:
    """The shard with the fewest messages (lowest index on ties)."""
    return min(shard_depths, key=lambda shard: (shard_depths[shard], shard))
