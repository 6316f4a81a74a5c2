"""A task backlog under Ray's own autoscaler (the fake multi-node provider, as in
test_autoscaler.py): consumers that follow the backlog (``min_count=0``) ask for room
with ``request_resources`` when tasks wait, a worker comes and runs them, and once
the backlog idled the request is withdrawn, the consumers stop and the worker goes.

Runs ``ray stop --force`` like test_autoscaler.py: marked own_process (tests/own_process.sh).
"""

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig, FairnessConfig, StoreConfig
from tests.integration.conftest import wait_until
from tests.integration import test_autoscaler
from tests.integration.test_autoscaler import (DATA, consumer_nodes, requested, square,
                                               worker_nodes)

pytestmark = [pytest.mark.integration, pytest.mark.own_process]
cluster = test_autoscaler.cluster  # its fixture: a cluster of this module's own

TASKS = 20
# One thread a consumer: 20 tasks want max_count consumers, one CPU each: a worker.
CONSUMERS = ConsumerConfig(min_count=0, max_count=2, scale_down_idle_s=2.0, num_cpus=1,
                           max_load=1, poll_wait_s=0.3, adjust_interval_s=0.2,
                           visibility_timeout_s=30.0)
NO_BOOSTERS = FairnessConfig(max_boost_consumers=0)  # the backlog alone asks for room


def test_a_backlog_asks_for_a_worker_that_goes_once_the_backlog_idled(cluster, tmp_path):
    config = Config(store=StoreConfig(data_resource=DATA), consumers=CONSUMERS,
                    fairness=NO_BOOSTERS)
    client = rayq.start(data_dir=tmp_path / "data", config=config)
    assert client.consumer_stats() == [] and requested() == [] and not worker_nodes()

    client.register(square)
    refs = [client.submit(square, i) for i in range(TASKS)]
    wait_until(lambda: requested() == [{"CPU": 1}] * 2, 60, what="room for two consumers")
    wait_until(lambda: len(worker_nodes()) == 1, 180, what="a worker for the backlog")
    assert ray.get(refs, timeout=300) == [i * i for i in range(TASKS)]
    assert consumer_nodes() <= worker_nodes()

    wait_until(lambda: requested() == [], 120, what="the request to be withdrawn")
    wait_until(lambda: client.consumer_stats() == [], 120, what="the consumers to stop")
    wait_until(lambda: not worker_nodes(), 180, what="the idle worker to be removed")
    assert client.queue("tasks").count() == 0
    rayq.shutdown()
