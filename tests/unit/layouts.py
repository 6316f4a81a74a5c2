"""Queue layouts for unit tests of the actors' decisions (no registry needed)."""

from rayq.core.auth.accounts import ADMIN
from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueInfo, SubqueueInfo


def queue_info(name: str, placement: dict[int, int], *, owner: str = ADMIN,
               dedicated: dict[int, tuple[str, str]] | None = None,
               states: dict[int, SubqueueState] | None = None,
               max_receives: int | None = 5) -> QueueInfo:
    """A queue whose subqueues are ``placement`` {subqueue id: shard}; ``dedicated`` and
    ``states`` set some subqueues' flooder and state (ALL otherwise)."""
    dedicated, states = dedicated or {}, states or {}
    subqueues = tuple(SubqueueInfo(sq, shard, states.get(sq, SubqueueState.ALL), 1,
                                   dedicated.get(sq))
                      for sq, shard in placement.items())
    return QueueInfo(name, subqueues, 1, max_receives, (), 0.0, owner=owner)
