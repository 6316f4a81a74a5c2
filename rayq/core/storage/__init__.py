"""The shard's storage engine: queue semantics over an ordered key-value store.

``store`` is the shard store; ``layout`` owns every table's bytes and lists the tables;
``ledger`` is the row bookkeeping of one write transaction over the shard's in-memory
index; ``writes`` holds every write as a record that knows how to run, calling the
operations of ``messages`` (put, receive, receipts, expiry), ``picking`` (which rows a
receive takes), ``spill``, ``outcomes`` and ``purge``, each a function over a ledger.
``dispatch`` orders a subqueue's fairness keys; ``cache`` is the memory-pressure-aware
message cache; ``waiters`` parks calls on task outcomes.
Storage imports no auth, fairness, control or flood module:
the policy it needs comes in as arguments (a sender check, flooders' diverts)."""
