"""What names a runtime and its actors in Ray: the runtime's namespace (one per runtime
on a cluster), the runtime this process talks to, and the actors' names. The client,
the CLI and the actors all read them here."""

import os

DEFAULT_RUNTIME = "rayq"  # the runtime ``Config.name`` names by default
RUNTIME_VAR = "RAYQ_RUNTIME"  # in a runtime actor's environment: the runtime it serves
_serving: list[str] = []  # the runtime this process talks to, once known
MANAGER = "rayq-manager"
COORDINATOR = "rayq-coordinator"
FLOOD_DETECTOR = "rayq-flood-detector"
SQS_STATE = "rayq-sqs-state"  # the SQS endpoint's shared state, when it is served

# Ray starts worker processes at niceness 15, below its raylet, so that tasks yield to
# it. The runtime's actors are servers with deadlines: leaders answer pings within a
# second (one that misses them is failed over), and consumers renew their messages'
# visibility on a heartbeat (one that renews late sees its message run twice). At 15 a
# node busy with other work starves them. They run at the normal priority, as Ray's own
# job supervisors do (Ray sets this variable for them too).


def runtime_namespace(name: str) -> str:
    """The Ray namespace (and internal KV namespace) of the runtime called ``name``:
    ``rayq`` for the default one, ``rayq-<name>`` for any other, so that runtimes on one
    cluster never see each other's actors or records, nor a job's own."""
    return DEFAULT_RUNTIME if name == DEFAULT_RUNTIME else f"{DEFAULT_RUNTIME}-{name}"


def serve(name: str) -> None:
    """Talk to the runtime called ``name`` from now on (``rayq.start`` and ``rayq.connect``
    of a driver; one runtime per process at a time)."""
    _serving[:] = [runtime_namespace(name)]


def namespace() -> str:
    """The namespace of the runtime this process talks to: the one its last start or
    connect named; in a runtime actor, the one whose actor started it (its environment
    says so); else the default runtime's."""
    if not _serving:
        _serving.append(os.environ.get(RUNTIME_VAR) or DEFAULT_RUNTIME)
    return _serving[0]


def server_env() -> dict:
    """The runtime environment of a runtime actor: normal priority (see above), and the
    runtime it serves."""
    return {"env_vars": {"RAY_worker_niceness": "0", RUNTIME_VAR: namespace()}}


def shard_name(index: int) -> str:
    return f"rayq-shard-{index}"


def consumer_name(index: int | str) -> str:
    return f"rayq-consumer-{index}"


def outcome_desk_name(index: int) -> str:
    return f"rayq-outcomes-{index}"
