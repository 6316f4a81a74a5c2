"""Thin Ray actors around rayq.core. Only rayq/__init__, rayq.client and rayq.cli import this."""

NAMESPACE = "rayq"
MANAGER = "rayq-manager"
COORDINATOR = "rayq-coordinator"
FLOOD_DETECTOR = "rayq-flood-detector"

# Ray starts worker processes at niceness 15, below its raylet, so that tasks yield to
# it. The runtime's actors are servers with deadlines: leaders answer pings within a
# second (one that misses them is failed over), and consumers renew their messages'
# visibility on a heartbeat (one that renews late sees its message run twice). At 15 a
# node busy with other work starves them. They run at the normal priority, as Ray's own
# job supervisors do (Ray sets this variable for them too).
SERVER_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}


def shard_name(index: int) -> str:
    return f"rayq-shard-{index}"


def consumer_name(index: int | str) -> str:
    return f"rayq-consumer-{index}"


def outcome_desk_name(index: int) -> str:
    return f"rayq-outcomes-{index}"
