"""Thin Ray actors around rayq.core. Only rayq/__init__, rayq.client and rayq.cli import this."""

NAMESPACE = "rayq"
MANAGER = "rayq-manager"
COORDINATOR = "rayq-coordinator"
FLOOD_DETECTOR = "rayq-flood-detector"

# Ray starts worker processes at niceness 15, below its raylet, so that tasks yield to
# it. The runtime's own actors are servers that answer within a ping's timeout: at 15
# a busy node's batch work starves them, and a leader that misses its pings is failed
# over. They run at the normal priority, as Ray's own job supervisors do (Ray sets this
# variable for them too). Consumers run users' handlers: they keep Ray's default, said
# explicitly, since an actor inherits the runtime environment of the actor that
# starts it (the manager starts them).
SERVER_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}
HANDLER_ENV = {"env_vars": {"RAY_worker_niceness": "15"}}


def shard_name(index: int) -> str:
    return f"rayq-shard-{index}"


def consumer_name(index: int | str) -> str:
    return f"rayq-consumer-{index}"
