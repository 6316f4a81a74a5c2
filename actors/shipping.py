"""The leader's calls to its followers and to the manager, for
:class:`rayq.core.control.shipping.Shipper` (docs/replication.md)."""

from __future__ import annotations

import ray

from actors import MANAGER, NAMESPACE
from rayq.core.control.placement import ShardPlace
from rayq.core.kit.kv import WriteSet
from rayq.remote import IN_RUNTIME, NO_RETRY, call_async


def follower_name(index: int, node: str) -> str:
    return f"rayq-follower-{index}-{node}"


class RayPeers:
    """Followers by name (``rayq-follower-<shard>-<node>``), each call tried once; the
    manager with the runtime's retries."""

    def __init__(self, index: int):
        self.index = index
        self._followers: dict[str, object] = {}

    def _follower(self, node: str):
        found = self._followers.get(node)
        if found is None:
            found = self._followers[node] = ray.get_actor(follower_name(self.index, node),
                                                          namespace=NAMESPACE)
        return found

    async def state(self, node: str) -> tuple[int, int]:
        follower = self._follower(node)
        return await call_async(lambda: follower.state.remote(), NO_RETRY)

    async def apply(self, node: str, epoch: int, first_seq: int, sets: list[WriteSet]) -> int:
        follower = self._follower(node)
        return await call_async(lambda: follower.apply.remote(epoch, first_seq, sets), NO_RETRY)

    async def shrink(self, node: str, epoch: int) -> ShardPlace:
        manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
        return await call_async(lambda: manager.shrink_in_sync.remote(self.index, node, epoch),
                                IN_RUNTIME)
