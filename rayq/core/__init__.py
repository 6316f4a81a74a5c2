"""The pure engine of rayq: storage, replication, policies and codecs. Never imports
``ray`` nor the actors.

Its wings, each importing only those listed before it (tests/unit/test_layering.py
holds them to it):

- ``codec``: codecs and the value types every wing shares.
- ``kit``: small tools every wing uses: the clock, the key-value layer, back-off.
- ``auth``: accounts, request signatures and the gate that checks them.
- ``storage``: a shard's store: queue semantics over the key-value layer.
- ``replication``: copies of a store kept in sync by shipping its write sets, and the
  shard places (replicas, in-sync set, epoch) a failover changes.
- ``fairness``: usage, victims and listen order across job types and tenants.
- ``control``: the queue and task registries, placement, scaling, routes, and the
  control plane's own replicated stores.
- ``consumers``: what a consumer decides: how hard to poll, what to run, how a
  delivery ends.
- ``flood``: which tenants flood, and where their messages go.
"""
