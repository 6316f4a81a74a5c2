"""Thin Ray actors around rayq.core. Only rayq/__init__, rayq.client and rayq.cli import this."""

NAMESPACE = "rayq"
MANAGER = "rayq-manager"
COORDINATOR = "rayq-coordinator"
FLOOD_DETECTOR = "rayq-flood-detector"


def shard_name(index: int) -> str:
    return f"rayq-shard-{index}"


def consumer_name(index: int | str) -> str:
    return f"rayq-consumer-{index}"
