"""The event log's one schema, versioned. Every writer and the report use it.

One row per event. ``kind`` says which columns matter:
- ``enqueue``: subqueue, tenant, type, key, message_id;
- ``completion``: tenant, type, key, message_id, queue, usage_s, wait_s,
  outcome (succeeded, failed, dead), attempt;
- ``deferral``: as completion, usage 0, detail = the cause (concurrency,
  host_pressure, suspended or cannot_run: see ``rayq.core.codec.tasks.DeferralCause``);
- ``redelivery``: a delivery with attempt > 1 (also logged as its completion);
- ``dead_letter``: a task that ended in the dead-letter queue;
- ``fairness``: outcome "intervening", "fair", or "passive" (it would intervene, but
  interventions were passive: nothing changed), detail = the decision as JSON;
- ``flood``: queue, type, tenant, outcome = detected / isolated / swept /
  sweep paused / removed, detail = its figures as JSON;
- ``noisy``: a shard's fair dispatch marked a key noisy or quiet again: subqueue,
  key, outcome = noisy / quiet, detail = why (in-flight share, processing-time
  share, drained, idle).
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1
KINDS = ("enqueue", "completion", "deferral", "redelivery", "dead_letter", "fairness", "flood",
         "noisy")

EVENT_SCHEMA = pa.schema([
    ("schema_version", pa.int16()),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("kind", pa.string()),
    ("queue", pa.string()),
    ("subqueue", pa.int64()),
    ("tenant", pa.string()),
    ("type", pa.string()),
    ("key", pa.string()),
    ("message_id", pa.string()),
    ("usage_s", pa.float64()),
    ("wait_s", pa.float64()),
    ("outcome", pa.string()),
    ("attempt", pa.int32()),
    ("detail", pa.string()),
], metadata={"rayq.schema_version": str(SCHEMA_VERSION)})

FIELDS = tuple(EVENT_SCHEMA.names)

# The report's tables (rayq.analytics.jobs computes them), in the order they are made.
TABLES = ("summary", "usage_by_tenant", "usage_by_type", "usage_share_by_window",
          "usage_share_by_tenant_window", "fairness_index_by_window", "wait_by_window",
          "throughput_by_window",
          "redeliveries", "flood_timeline", "intervention_timeline", "suggested_thresholds")
