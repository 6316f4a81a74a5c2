"""A type with a custom resource on a simulated cluster (ray.cluster_utils.Cluster), run
as its own process by tests/integration/test_task_placement.py; prints one JSON line.

The head holds the runtime's data (the rayq_data resource) and its consumers; a second
node has the ``special`` resource and no data. Tasks of a type asking for ``special``
run as Ray tasks on that node, wherever the consumer that received them runs.
"""

import json
import sys
import tempfile

import ray
from ray.cluster_utils import Cluster

import rayq
from rayq.config import Config, ConsumerConfig, StoreConfig


@rayq.task(type="where-special", resources={"special": 1})
def where_special():
    return ray.get_runtime_context().get_node_id()


def main() -> None:
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "resources": {"rayq_data": 1}})
    # room for a consumer (0.5 CPU) beside a task (1 CPU) wherever the consumer lands
    special = cluster.add_node(num_cpus=2, resources={"special": 1})
    ray.init(address=cluster.address, namespace="rayq", log_to_driver=False)
    config = Config(store=StoreConfig(data_resource="rayq_data"),  # the data on the head only
                    consumers=ConsumerConfig(count=1, poll_wait_s=0.3))
    client = rayq.start(data_dir=tempfile.mkdtemp(prefix="rayq-task-placement-"), config=config)
    ran_on = ray.get([client.submit(where_special) for _ in range(3)], timeout=300)
    print(json.dumps({"ran_on": ran_on, "special_node": special.node_id}))
    rayq.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
