"""Consumers follow the task backlog on real Ray (docs/autoscaling.md#consumers-follow-the-backlog):
none while nothing waits, one as soon as a task does, none again once the backlog idled;
scale_consumers pins a count until it is handed back to the rule."""

import time

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime, wait_until

IDLE_S = 2.0
CONFIG = Config(consumers=ConsumerConfig(min_count=0, max_count=2, scale_down_idle_s=IDLE_S,
                                         visibility_timeout_s=5.0, poll_wait_s=0.5))


@rayq.task(type="autoscaled_add")
def add(a, b=0):
    return a + b


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="consumer-autoscaling")
    yield client


def no_consumers(client) -> bool:
    return not client.consumer_stats()


def test_a_runtime_that_may_scale_to_zero_starts_without_consumers(client):
    assert client.consumer_stats() == []


def test_a_task_brings_a_consumer_and_they_go_back_to_zero_once_idle(client):
    ref = client.submit(add, 20, b=22)
    assert ray.get(ref, timeout=180) == 42
    wait_until(lambda: no_consumers(client), timeout_s=180, what="the consumers to stop")
    # and from zero again
    assert ray.get(client.submit_many(add, [(i, 1) for i in range(20)]), timeout=180) == [
        i + 1 for i in range(20)]
    wait_until(lambda: no_consumers(client), timeout_s=180, what="the consumers to stop")


def test_scale_consumers_pins_a_count_until_it_is_handed_back_to_the_rule(client):
    assert client.scale_consumers(1) == 1
    wait_until(lambda: len(client.consumer_stats()) == 1, timeout_s=120, what="one consumer")
    time.sleep(3 * IDLE_S)  # several rounds of an empty backlog: a pinned count stays
    assert len(client.consumer_stats()) == 1
    assert client.scale_consumers(None) == 1  # handed back: the rule lowers it
    wait_until(lambda: no_consumers(client), timeout_s=180, what="the consumers to stop")
