"""A shard's copy kept from the leader's write sets (docs/replication.md).

Laid out as a leader's store (the same tables), so a promoted copy opens as one.
Write sets arrive numbered by sequence; each batch is applied in one transaction
with one fsync, with the replica's epoch and last applied sequence number in the
same transaction (``layout.REPLICA_KEY``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence

from rayq.core.kit.kv import KV, LmdbKV, WriteSet, apply_writes, peek
from rayq.core.kit.private import make_private_dir
from rayq.core.storage.layout import REPLICA_KEY, read_replica_state, replica_state
from rayq.errors import ReplicaBehind, StaleEpoch

log = logging.getLogger("rayq.replica")


def check_epoch(held: int, offered: int, what: str = "write") -> None:
    """Raise StaleEpoch when ``offered`` is older than the ``held`` epoch."""
    if offered < held:
        raise StaleEpoch(f"{what} under epoch {offered} refused: this replica holds epoch {held}")


def fresh_count(applied_seq: int, first_seq: int, count: int) -> int:
    """How many of ``count`` write sets numbered from ``first_seq`` a follower that
    applied through ``applied_seq`` still lacks (the rest came before: a resend).
    Raises ReplicaBehind when they start past a gap: the follower missed some."""
    if first_seq > applied_seq + 1:
        raise ReplicaBehind(f"write sets from {first_seq} offered to a replica at {applied_seq}")
    return max(0, first_seq + count - 1 - applied_seq)


class Replica:
    """The follower's side: apply, fence, state; over any :class:`KV`."""

    def __init__(self, kv: KV):
        self.kv = kv
        self.epoch, self.seq = read_replica_state(kv.read(lambda txn: txn.get("meta", REPLICA_KEY)))

    def apply(self, epoch: int, first_seq: int, write_sets: Sequence[WriteSet]) -> int:
        """Apply the write sets numbered from ``first_seq`` that this replica lacks, in
        one transaction, and hold ``epoch`` from now on; returns the last sequence
        number applied. Raises StaleEpoch for an epoch older than the one held, and
        ReplicaBehind for write sets past a gap (nothing is applied then)."""
        check_epoch(self.epoch, epoch)
        fresh = fresh_count(self.seq, first_seq, len(write_sets))
        if fresh or epoch > self.epoch:
            last = max(self.seq, first_seq + len(write_sets) - 1)

            def write(txn) -> None:
                for writes in write_sets[len(write_sets) - fresh:]:
                    apply_writes(txn, writes)
                txn.put("meta", REPLICA_KEY, replica_state(epoch, last))
            self.kv.transact(write)
            self.epoch, self.seq = epoch, last
        return self.seq

    def fence(self, epoch: int) -> tuple[int, int]:
        """Hold ``epoch`` durably from now on (a newer leader takes over): write sets of
        older epochs are refused. Returns (epoch held, last applied sequence number)."""
        if epoch > self.epoch:
            seq = self.seq
            self.kv.transact(lambda txn: txn.put("meta", REPLICA_KEY, replica_state(epoch, seq)))
            self.epoch = epoch
        return self.epoch, self.seq

    def install(self, epoch: int, seq: int) -> None:
        """This store was just copied from the leader's at ``seq``: hold that, and ``epoch``."""
        self.kv.transact(lambda txn: txn.put("meta", REPLICA_KEY, replica_state(epoch, seq)))
        self.epoch, self.seq = epoch, seq


def open_copy(path: str | os.PathLike, map_bytes: int) -> Replica:
    """The copy at ``path`` (an LMDB environment of ``map_bytes`` to start with), as a
    follower holds it: always fsynced on commit, whatever ``StoreConfig.durable`` says
    of the leader's store, since a follower's answer is what a write's acknowledgement
    waits for."""
    return Replica(LmdbKV(path, map_size=map_bytes))


def clear_for_seed(path: str, seq: int) -> None:
    """Empty the copy at ``path`` for a seed as of ``seq``. A copy that applied more
    than that is moved aside to ``<path>.kept-<epoch>-<seq>``, never deleted: a seed
    never destroys write sets its source lacks (a leader may have acknowledged them)."""
    epoch, held = read_replica_state(peek(path, "meta", REPLICA_KEY))
    if held > seq:
        aside = f"{path}.kept-{epoch}-{held}"
        log.error("the copy at %s applied %d, more than the seed's %d: kept at %s",
                  path, held, seq, aside)
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(path, aside)
    shutil.rmtree(path, ignore_errors=True)
    make_private_dir(path)
