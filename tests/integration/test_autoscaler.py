"""rayq under Ray's own autoscaler (the fake multi-node provider: the real autoscaler
monitor starting and stopping real local raylets as "nodes").

The cluster has cluster.yaml's shape: a head with no CPUs and the data resource, and
a worker type with CPUs, from 0 to 2 nodes. ``scale_consumers`` and booster permits
ask for room with ``request_resources``; the autoscaler adds workers, consumers start
there and run every task; when the demand is gone rayq withdraws its request and the
idle workers are removed.

``AutoscalingCluster.start()`` runs ``ray stop --force``, which stops every Ray on the
machine: this module runs in its own pytest process after the others (``make test``),
inside its own PID and mount namespace where the machine allows it (tests/isolated).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import ray
from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
from ray.cluster_utils import AutoscalingCluster
from ray.experimental.internal_kv import _internal_kv_get
from ray.util.state import list_actors

import rayq
from rayq.config import Config, ConsumerConfig, FairnessConfig, StoreConfig
from rayq.runtime.local import DASHBOARD_PORT, free_port
from tests.integration.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.own_process]

DATA = "rayq_data"
WORKER_CPUS = 2
TASKS = 160
# Idle workers go after 30 s: long enough that a worker the autoscaler just added is
# not taken for idle while its consumers are still being placed on a loaded machine
# (at 6 s, beside two CPU burners, the first worker went before its consumers ran).
IDLE_TIMEOUT_MIN = 0.5
# What fake_multi_node/example.yaml holds in Ray's source tree; the 2.60 wheel ships
# no copy, so AutoscalingCluster gets it from here.
BASE_CONFIG = {
    "cluster_name": "rayq-fake", "max_workers": 2, "upscaling_speed": 1.0,
    "idle_timeout_minutes": IDLE_TIMEOUT_MIN,
    "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                 "disable_node_updaters": True, "disable_launch_config_check": True},
    "auth": {}, "docker": {}, "head_node_type": "ray.head.default",
    "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
    "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [],
    "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
    "head_start_ray_commands": [], "worker_start_ray_commands": [],
}
CONSUMERS = ConsumerConfig(count=0, num_cpus=1, max_load=1, poll_wait_s=0.3,
                           adjust_interval_s=0.2, visibility_timeout_s=30.0)
# Scaled down: waits past half a second earn booster permits, evaluated twice a second.
FAIRNESS = FairnessConfig(window_s=2.0, windows=6, latency_threshold_s=0.5, interval_s=0.5,
                          max_boost_consumers=2)


class RayqAutoscalingCluster(AutoscalingCluster):
    """AutoscalingCluster with the base config given here, and a head whose custom
    resources reach ``ray start`` (the stock start() quotes them for a shell, but
    runs no shell)."""

    def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False,
                         **config_kwargs):
        config = json.loads(json.dumps(BASE_CONFIG))
        config["available_node_types"] = dict(worker_node_types)
        config["available_node_types"]["ray.head.default"] = {
            "resources": head_resources, "node_config": {}, "max_workers": 0}
        config.update(config_kwargs)
        return config

    def start(self, _system_config=None, override_env=None):
        subprocess.check_call(["ray", "stop", "--force"])
        fd, path = tempfile.mkstemp(prefix="rayq-autoscaler-", suffix=".json")
        self.config_path = path
        with os.fdopen(fd, "w") as f:
            json.dump(self._config, f)
        resources = dict(self._head_resources)
        cmd = ["ray", "start", "--head", f"--autoscaling-config={path}",
               f"--num-cpus={resources.pop('CPU', 0)}", f"--resources={json.dumps(resources)}",
               # a Ray outside this test's namespaces (one still stopping) may hold 8265
               f"--dashboard-port={free_port(DASHBOARD_PORT)}"]
        env = {**os.environ, "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1"}
        subprocess.check_call(cmd, env=env)
        ray._private.services.find_gcs_addresses.cache_clear()


@rayq.task(type="square")
def square(x):
    time.sleep(0.2)
    return x * x


@rayq.task(type="cube")
def cube(x):
    time.sleep(0.2)
    return x * x * x


class Timeline:
    """Seconds since the test began, by event."""

    def __init__(self):
        self.t0, self.at = time.monotonic(), {}

    def mark(self, event: str) -> None:
        self.at[event] = round(time.monotonic() - self.t0, 1)


def worker_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0}


def consumer_nodes() -> set[str]:
    """Where the live consumer actors run (Ray's state API, served by the dashboard)."""
    return {a.node_id for a in list_actors(filters=[("class_name", "=", "ConsumerActor"),
                                                    ("state", "=", "ALIVE")])}


def requested() -> list[dict]:
    """The bundles rayq asked the autoscaler for (what request_resources wrote)."""
    raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(raw) if raw else []


@pytest.fixture(scope="module")
def cluster():
    bin_dir = os.path.dirname(sys.executable)  # `ray` of this interpreter, for start()
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    assert shutil.which("ray"), "the ray command is not installed"
    cluster = RayqAutoscalingCluster(
        head_resources={"CPU": 0, DATA: 2},
        worker_node_types={"worker": {"resources": {"CPU": WORKER_CPUS}, "node_config": {},
                                      "min_workers": 0, "max_workers": 2}})
    cluster.start()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.remove(cluster.config_path)


def test_consumers_and_boosters_bring_workers_that_go_when_the_demand_does(cluster, tmp_path):
    timeline = Timeline()
    config = Config(store=StoreConfig(data_resource=DATA), consumers=CONSUMERS, fairness=FAIRNESS)
    client = rayq.start(data_dir=tmp_path / "data", config=config)  # attaches to the cluster
    assert len(worker_nodes()) == 0 and requested() == []
    head = ray.nodes()[0]["NodeManagerAddress"]
    assert head != "127.0.0.1", "a cluster keeps Ray's own node address, not loopback"

    # scale_consumers: room for two one-CPU consumers, which only a worker has.
    client.scale_consumers(2)
    assert requested() == [{"CPU": 1}] * 2
    wait_until(lambda: len(worker_nodes()) == 1, 120, what="a worker for the consumers")
    timeline.mark("first worker added")
    client.register(square)
    client.register(cube)
    warmup = [client.submit(square, i, tenant="acme") for i in range(4)]
    assert ray.get(warmup, timeout=120) == [i * i for i in range(4)]
    wait_until(lambda: consumer_nodes() == worker_nodes(), 60, what="consumers on the worker")
    timeline.mark("consumers ran on it")

    # A backlog two consumers of one thread each cannot keep under the latency
    # threshold: permits become booster consumers, and boosters need a second worker.
    refs = [client.submit(square if i % 2 else cube, i, tenant="globex" if i % 3 else "acme")
            for i in range(TASKS)]
    wait_until(lambda: len(requested()) > 2, 60, what="booster consumers to ask for room")
    timeline.mark("boosters requested")
    wait_until(lambda: len(worker_nodes()) == 2, 120, what="a second worker for the boosters")
    timeline.mark("second worker added")
    wait_until(lambda: consumer_nodes() == worker_nodes(), 60, what="boosters on the new worker")
    results = ray.get(refs, timeout=300)
    timeline.mark("every task done")
    assert results == [i ** 2 if i % 2 else i ** 3 for i in range(TASKS)]

    # The demand is gone: boosters stop (fewer bundles), then no consumers (none).
    wait_until(lambda: len(requested()) == 2, 60, what="the booster request to be withdrawn")
    timeline.mark("booster request withdrawn")
    client.scale_consumers(0)
    assert requested() == []
    timeline.mark("consumer request withdrawn")
    wait_until(lambda: len(worker_nodes()) == 0, 180, what="the idle workers to be removed")
    timeline.mark("idle workers removed")

    queue = client.queue("tasks")
    assert queue.count() == 0
    succeeded = sum(r.succeeded for r in client.task_stats(by="type"))
    assert succeeded == TASKS + 4
    print(f"\nautoscaler timeline (s since start): {json.dumps(timeline.at)}")
    rayq.shutdown()
