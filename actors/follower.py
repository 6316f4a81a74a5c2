"""FollowerActor: a shard's copy on another data node (docs/replication.md).

It holds an LMDB environment laid out as a leader's, at
``<data_dir>/<node>/shard-<i>``, so the manager promotes it by opening a ShardActor
on that folder. The leader's write sets arrive in order: one caller, one call at a
time (``max_concurrency=1``), and sequence numbers checked by
:class:`rayq.core.storage.replica.Replica`.
"""

from __future__ import annotations

import os

import ray

from rayq.core.kit.kv import LmdbKV, WriteSet
from rayq.core.storage.replica import Replica


class FollowerActor:
    def __init__(self, index: int, path: str, map_bytes: int = 256 << 20):
        self.index, self.path = index, path
        self._kv = LmdbKV(path, map_size=map_bytes)
        self.replica = Replica(self._kv)

    def apply(self, epoch: int, first_seq: int, write_sets: list[WriteSet]) -> int:
        return self.replica.apply(epoch, first_seq, write_sets)

    def fence(self, epoch: int) -> tuple[int, int]:
        return self.replica.fence(epoch)

    def state(self) -> tuple[int, int]:
        """(epoch held, last applied sequence number)."""
        return self.replica.epoch, self.replica.seq

    def close(self) -> None:
        """Close the environment (before a ShardActor opens this folder as leader)."""
        self._kv.close()

    def process(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


FollowerRemote = ray.remote(num_cpus=0, max_concurrency=1)(FollowerActor)
