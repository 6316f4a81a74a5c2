"""A background loop that keeps failing shows up: each failure is logged with its cause
and counted per loop, in the actors' statistics and the rayq_background_failures_total
metric. A shard killed for good makes the manager's scaling, the coordinator's
evaluation and the flood detector's runs fail every round."""

import logging

import pytest
import ray

import rayq
from rayq.names import COORDINATOR, FLOOD_DETECTOR, MANAGER, namespace, shard_name
from actors.metrics import BackgroundFailures
from rayq.config import Config, ConsumerConfig, FairnessConfig, FloodConfig, ScalingConfig, StoreConfig
from tests.integration.conftest import start_runtime, wait_until

@rayq.task(type="ping")
def ping(x):
    return x


CONFIG = Config(store=StoreConfig(shards=2), consumers=ConsumerConfig(count=1),
                scaling=ScalingConfig(interval_s=0.2), fairness=FairnessConfig(interval_s=0.2),
                flood=FloodConfig(interval_s=0.2))


def test_a_recorded_failure_is_logged_with_its_cause_and_counted(ray_session, caplog):
    failures = BackgroundFailures("shard", 3)
    try:
        raise rayq.StoreError("commit failed") from OSError(28, "No space left on device")
    except rayq.StoreError as err:
        failed = err
    with caplog.at_level(logging.WARNING, logger="rayq.shard"):
        failures.record("housekeeping", failed)
        failures.record("housekeeping", failed)
        failures.record("metrics", rayq.Overloaded("busy"))
    assert dict(failures.counts) == {"housekeeping": 2, "metrics": 1} and failures.total == 3
    logged = [r.getMessage() for r in caplog.records if r.name == "rayq.shard"]
    assert len(logged) == 3
    assert "shard 3: housekeeping failed (1 so far)" in logged[0] and "No space left" in logged[0]
    assert "housekeeping failed (2 so far)" in logged[1] and "metrics failed (1 so far)" in logged[2]


def test_every_actor_reports_its_background_failures(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="failures")
    # task queues are what the coordinator reads: give "tasks" a subqueue on each shard
    client.create_queue("tasks", subqueues=2)
    assert ray.get(client.submit(ping, "before"), timeout=60) == "before"
    assert [s.background_failures for s in client.stats()] == [0, 0]
    assert all(s.background_failures == 0 for s in client.consumer_stats())
    ray.kill(ray.get_actor(shard_name(1), namespace=namespace()), no_restart=True)

    manager = ray.get_actor(MANAGER, namespace=namespace())
    coordinator = ray.get_actor(COORDINATOR, namespace=namespace())
    detector = ray.get_actor(FLOOD_DETECTOR, namespace=namespace())
    wait_until(lambda: ray.get(manager.info.remote())["background_failures"].get("scaling", 0) >= 2,
               what="the manager to count failed scaling rounds")
    wait_until(lambda: ray.get(coordinator.background_failures.remote()).get("evaluation", 0) >= 2,
               what="the coordinator to count failed evaluations")
    wait_until(lambda: ray.get(detector.background_failures.remote()).get("detection", 0) >= 2,
               what="the flood detector to count failed runs")
    assert ray.get(client.transport.shards[0].stats.remote()).background_failures == 0  # shard 0 is fine
    rayq.shutdown()


@pytest.fixture(autouse=True, scope="module")
def _no_runtime_left():
    yield
    rayq.shutdown()
