"""Shards spread over data nodes on a simulated cluster (ray.cluster_utils.Cluster), run
as its own process by tests/integration/test_data_nodes.py; prints one JSON line.

The head holds no data; two data nodes (the rayq_data resource, rayq-data-node labels
n1 and n2) hold the shards, each in its own folder of the data directory, and every
actor holding a copy holds a sliver of its node's data resource.
"""

import json
import os
import sys
import tempfile
import time

import ray
from ray.cluster_utils import Cluster

import rayq
from rayq.config import Config, ConsumerConfig, StoreConfig


def data_claimed(timeout_s: float = 10.0) -> float:
    """How much of the data resource the runtime's actors hold (Ray reports it
    within a second or so of their start)."""
    deadline = time.monotonic() + timeout_s
    while True:
        claimed = ray.cluster_resources()["rayq_data"] - ray.available_resources().get(
            "rayq_data", 0.0)
        if claimed > 0 or time.monotonic() > deadline:
            return round(claimed, 6)
        time.sleep(0.2)


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for name in ("n1", "n2"):
        cluster.add_node(num_cpus=1, resources={"rayq_data": 1},
                         labels={"rayq-data-node": name})
    ray.init(address=cluster.address, namespace="rayq", log_to_driver=False)
    data_dir = tempfile.mkdtemp(prefix="rayq-data-nodes-")
    config = Config(store=StoreConfig(shards=4), consumers=ConsumerConfig(count=1))
    client = rayq.start(data_dir=data_dir, config=config)
    queue = client.create_queue("spread", subqueues=4, max_receives=None)
    acked = set(queue.send_batch([rayq.Outgoing(i, tenant="acme") for i in range(100)]))
    received = set()
    for _ in range(50):
        got = queue.receive(max_messages=100, wait_s=0.5)
        received.update(m.id for m in got)
        if got:
            queue.delete_batch([m.receipt for m in got])
        if acked <= received:
            break
    shards = {s.index: s.node for s in client.stats()}
    claimed = data_claimed()
    folders = {node: sorted(os.listdir(os.path.join(data_dir, node)))
               for node in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, node))}
    print(json.dumps({"shards": shards, "folders": folders, "claimed": claimed,
                      "acked_received": acked <= received, "acked": len(acked)}))
    rayq.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
