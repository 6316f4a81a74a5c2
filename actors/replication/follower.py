"""FollowerActor: a shard's copy on another data node (docs/replication.md).

It holds an LMDB environment laid out as a leader's, at
``<data_dir>/<node>/shard-<i>``, so the manager promotes it by opening a ShardActor
on that folder. The leader's write sets arrive in order: one caller, one call at a
time (``max_concurrency=1``), and sequence numbers checked by
:class:`rayq.core.replication.replica.Replica`.
"""

from __future__ import annotations

import os

import ray

from rayq.core.kit.kv import unpack_write_sets
from rayq.core.kit.private import FILE_MODE
from rayq.core.replication.replica import check_epoch, clear_for_seed, open_copy

class FollowerActor:
    """One copy of a shard. It stands apart from the actor kit (:mod:`actors.base`): a
    threaded actor, one call at a time, with no clock, background loop or ping (the
    keeper asks its ``state``); an async method of the kit's would make Ray run it as an
    async actor."""

    def __init__(self, index: int, path: str, map_bytes: int = 256 << 20):
        self.index, self.path, self._map_bytes = index, path, map_bytes
        self.replica = open_copy(path, map_bytes)

    def apply(self, epoch: int, first_seq: int, *parts: bytes) -> int:
        """Apply the write sets the leader packed (:func:`pack_write_sets`), in parts
        (:func:`rayq.core.kit.kv.inline_parts`)."""
        packed = parts[0] if len(parts) == 1 else b"".join(parts)
        return self.replica.apply(epoch, first_seq, unpack_write_sets(packed))

    def fence(self, epoch: int) -> tuple[int, int]:
        return self.replica.fence(epoch)

    def state(self) -> tuple[int, int]:
        """(epoch held, last applied sequence number)."""
        return self.replica.epoch, self.replica.seq

    # -- seeding: the leader's consistent copy arrives in chunks -------------------
    def begin_seed(self, epoch: int, seq: int) -> None:
        """Drop this copy: a fresh one from the leader of ``epoch``, as of ``seq``,
        replaces it (this one is kept aside if it applied more: see
        :func:`clear_for_seed`). Refused with StaleEpoch when this copy holds a newer
        epoch: a replaced leader's late seed."""
        check_epoch(self.replica.epoch, epoch, "seed")
        self.replica.kv.close()
        clear_for_seed(self.path, seq)
        self._part = os.fdopen(os.open(os.path.join(self.path, "data.mdb"),
                                       os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb")

    def seed_chunk(self, data: bytes) -> None:
        self._part.write(data)

    def end_seed(self, epoch: int, seq: int) -> int:
        """The copy is whole: make it durable, open it, hold ``epoch`` and ``seq``."""
        self._part.flush()
        os.fsync(self._part.fileno())
        self._part.close()
        self.replica = open_copy(self.path, self._map_bytes)
        self.replica.install(epoch, seq)
        return seq

    def close(self) -> None:
        """Close the environment (before a ShardActor opens this folder as leader)."""
        self.replica.kv.close()

    def process(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


FollowerRemote = ray.remote(num_cpus=0, max_concurrency=1)(FollowerActor)
