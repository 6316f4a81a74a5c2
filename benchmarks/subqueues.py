"""What a queue's subqueues buy, beside the shard count: durable end to end (one
pipeline of send_batch(500) -> receive(500) -> delete_batch per subqueue) through a
queue of 1, 2 and 4 subqueues, on runtimes of 1, 2 and 4 shards, in one run. Scaling
is held off, so each queue keeps the subqueues it was made with; a subqueue goes to
the shard holding the fewest of its queue's (docs/autoscaling.md). Subqueues sharing
a shard share its one LMDB writer and its fsyncs.

    python benchmarks/subqueues.py [--messages 40000]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402
from throughput import end_to_end, runtime  # noqa: E402

import rayq  # noqa: E402

SHARDS = (1, 2, 4)
SUBQUEUES = (1, 2, 4)
HELD = rayq.ScalingConfig(scale_up_ops_per_s=1e12, scale_up_throttled_per_s=1e12, idle_s=1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=40_000)
    args = parser.parse_args()
    rows = []
    for shards in SHARDS:
        config = rayq.Config(store=rayq.StoreConfig(shards=shards), scaling=HELD,
                             consumers=rayq.ConsumerConfig(count=0))
        with runtime(config, prefix="rayq-bench-subqueues-") as (client, _):
            end_to_end(client, 4_000, pipelines=1)  # warm-up
            client.delete_queue("bench-e2e")
            one = None
            for subqueues in SUBQUEUES:
                rate = end_to_end(client, args.messages, pipelines=subqueues)
                client.delete_queue("bench-e2e")
                one = one or rate
                rows.append({"figure": f"e2e, {subqueues} subqueue(s), {shards} shard(s)",
                             "value": rate, "unit": "msg/s",
                             "baseline": f"1 subqueue, {shards} shard(s), same run",
                             "baseline_value": one})
    report("subqueues", rows, {"messages": args.messages, "shards": SHARDS,
                               "subqueues": SUBQUEUES})


if __name__ == "__main__":
    main()
