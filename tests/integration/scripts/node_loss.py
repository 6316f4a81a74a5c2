"""Node loss on a simulated multi-node cluster (ray.cluster_utils.Cluster), run as its
own process by tests/integration/test_node_loss.py; prints one JSON line.

The head holds the data (the rayq_data resource) and no CPUs; consumers run on a
worker node, which is removed mid-workload and replaced by a fresh one.
"""

import json
import sys
import tempfile
import time

import ray
from ray.cluster_utils import Cluster

import rayq
from rayq.config import Config, ConsumerConfig, StoreConfig


@rayq.task(type="cube")
def cube(x):
    time.sleep(0.05)
    return x ** 3


def main() -> None:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "resources": {"rayq_data": 2}})
    worker = cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, namespace="rayq", log_to_driver=False)
    config = Config(store=StoreConfig(data_resource="rayq_data"),
                    consumers=ConsumerConfig(count=2, visibility_timeout_s=2.0, poll_wait_s=0.3))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-node-loss-"), config=config)
    queue = client.create_queue("plain", max_receives=None)
    acked = set(queue.send_batch([rayq.Outgoing(i, tenant="acme") for i in range(200)]))
    refs = [(client.submit(cube, i, tenant=f"t{i % 3}"), i ** 3) for i in range(60)]
    time.sleep(1.0)  # consumers are busy on the worker node
    cluster.remove_node(worker)
    cluster.add_node(num_cpus=2)  # the replacement: consumers restart there
    results = [ray.get(ref, timeout=180) == expected for ref, expected in refs]
    received = set()
    deadline = time.time() + 60
    while not acked <= received and time.time() < deadline:
        got = queue.receive(max_messages=100, wait_s=1)
        received.update(m.id for m in got)
        if got:
            queue.delete_batch([m.receipt for m in got])
    after = ray.get(client.submit(cube, 3), timeout=120)
    print(json.dumps({"tasks_ok": sum(results), "tasks": len(results),
                      "acked_received": acked <= received, "after": after}))
    rayq.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
