"""The queue manager's rules, as functions of the registry's records (the manager
actor holds the records, asks the shards, and calls these): who may see, create
and register what, and the per-shard arithmetic of placement and consumers.

An account sees its own queues; the admin (the ``default`` account) sees every
account's; task queues belong to the admin and any account may submit to them,
but only the admin owns (deletes, clears) them or registers their handlers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from rayq.core.auth.accounts import ADMIN, may_use
from rayq.core.auth.quotas import Quota, Room
from rayq.core.control.registry import QueueInfo, SubqueueInfo, check_queue_name
from rayq.core.codec.tasks import TaskSpec
from rayq.errors import AuthError, InvalidMessage, QueueNotFound


def may_see(account: str, queue: QueueInfo | None, task_queues: Collection[str], *,
            owned: bool = False) -> bool:
    """Whether ``account`` may reach ``queue`` (None: no such queue): its own, any for
    the admin, or a task queue of the admin's, to submit to (unless ``owned``)."""
    if queue is None:
        return False
    if may_use(account, queue.owner):
        return True
    return not owned and queue.owner == ADMIN and queue.name in task_queues


def check_visible(account: str, name: str, queue: QueueInfo | None,
                  task_queues: Collection[str], *, owned: bool = False) -> QueueInfo:
    """``queue`` if ``account`` may reach it; otherwise QueueNotFound, worded as for a
    missing queue, so that no account learns which names another account uses."""
    if not may_see(account, queue, task_queues, owned=owned):
        raise QueueNotFound(f"no queue named {name!r}")
    return queue


def check_may_create(account: str, owner: str, accounts: Collection[str]) -> None:
    """Raise AuthError unless ``account`` creates in its own namespace (the admin in
    any), InvalidMessage when the namespace's account does not exist."""
    if not may_use(account, owner):
        raise AuthError(f"account {account!r} creates queues in its own namespace only")
    if owner not in accounts:
        raise InvalidMessage(f"no account named {owner!r}")


def visible_names(account: str, queues: Iterable[QueueInfo], every_name: list[str]) -> list[str]:
    """``list_queues``: the admin sees ``every_name`` (the others' as ``account/name``),
    any other account its own queues by plain name."""
    if account == ADMIN:
        return every_name
    return sorted(q.name for q in queues if q.owner == account)


def owned_queues(queues: Iterable[QueueInfo], owner: str) -> int:
    """How many queues ``owner`` has, against its queue quota (a queue's DLQ comes with it)."""
    return sum(1 for q in queues if q.owner == owner and not q.is_dlq)


def rooms_of(limited: Mapping[str, Quota], queues: Iterable[QueueInfo],
             counts: Mapping[int, int], counted_at: float) -> dict[str, Room]:
    """Each limited account's Room: its quota and the messages its queues held at the
    count made at ``counted_at`` (``counts``: per subqueue, every shard)."""
    held = dict.fromkeys(limited, 0)
    for queue in queues:
        if queue.owner in held:
            held[queue.owner] += sum(counts.get(sq.id, 0) for sq in queue.subqueues)
    return {account: Room(account, quota, held[account], counted_at)
            for account, quota in limited.items()}


def check_task_spec(spec: Any) -> TaskSpec:
    """``spec`` if it is a TaskSpec whose queue is a plain name (a task queue is the
    default account's); InvalidMessage otherwise."""
    if not isinstance(spec, TaskSpec):
        raise InvalidMessage("register_task takes a TaskSpec")
    check_queue_name(spec.queue)
    return spec


def is_registration(account: str, spec: TaskSpec, known: TaskSpec | None) -> bool:
    """Whether ``register_task`` by ``account`` registers (the admin's) or is a no-op (an
    account naming a type registered already with the same spec). Raises AuthError
    for anything else: handlers run inside the runtime, so only the admin adds them."""
    if account == ADMIN:
        return True
    if known != spec:
        raise AuthError(f"task type {spec.type!r} is not registered as given; only "
                        f"the {ADMIN!r} account registers task handlers")
    return False


def ids_by_shard(subqueues: Iterable[SubqueueInfo]) -> dict[int, list[int]]:
    """Subqueue ids grouped by the shard that holds them (one call per shard)."""
    out: dict[int, list[int]] = defaultdict(list)
    for sq in subqueues:
        out[sq.shard].append(sq.id)
    return dict(out)


def shard_depths(queues: Iterable[QueueInfo], counts: Mapping[int, int], shards: int
                 ) -> dict[int, int]:
    """Messages per shard (every shard, 0 if none) from per-subqueue ``counts``."""
    depths = dict.fromkeys(range(shards), 0)
    for queue in queues:
        for sq in queue.subqueues:
            depths[sq.shard] = depths.get(sq.shard, 0) + counts.get(sq.id, 0)
    return {i: depths[i] for i in range(shards)}


def concurrency_limits(specs: Iterable[TaskSpec], key_mode: str) -> dict[str, int]:
    """The concurrency limit per fairness key: a type's limit is its key's only when
    the key is the type (otherwise one key spans many types)."""
    if key_mode != "type":
        return {}
    return {spec.type: spec.concurrency for spec in specs if spec.concurrency}


def indexes_by_name(names: Iterable[str], prefix: str) -> dict[int, str]:
    """index -> name of the names ``prefix<index>`` (how consumer actors are named)."""
    return {int(name[len(prefix):]): name for name in names
            if name.startswith(prefix) and name[len(prefix):].isdigit()}


def consumers_to_change(total: int, running: Collection[int]) -> tuple[list[int], list[int]]:
    """(indexes to start, indexes to stop) so that consumers 0 .. total-1 run."""
    return ([i for i in range(total) if i not in running],
            [i for i in running if i >= total])
