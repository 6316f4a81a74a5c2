"""The shard's storage engine: queue semantics over an ordered key-value store.

``store`` is the shard store; ``layout`` owns every table's bytes; ``batch`` is one
write transaction, with ``picking``, ``spill``, ``outcomes`` and ``purge`` as the
operations it runs; ``dispatch`` orders a subqueue's fairness keys; ``cache`` is the
memory-pressure-aware message cache; ``waiters`` parks calls on task outcomes; and
``migrate`` opens stores written by older layouts. Storage imports no auth, fairness,
control or flood module: the policy it needs comes in as arguments."""
