"""Replication: a store's copies kept in sync before an acknowledgement (docs/replication.md).

A follower's copy applies the leader's write sets in order under an epoch (``replica``);
the leader ships each group commit's write set to its in-sync followers and leaves a
slow one out (``shipping``); a shard's place (replicas, in-sync set, epoch) changes by
the rules of ``shard_places``: shrink, rejoin, seed, fail over, drain. The control
plane's stores are kept the same way (:mod:`rayq.core.control.control_store`)."""
