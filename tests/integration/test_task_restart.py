"""Registered handlers outlive the runtime: queued tasks run after a full restart."""

import time

import ray

import rayq
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime
from tests.integration.probe import enter, leave, probe

CONFIG = Config(consumers=ConsumerConfig(count=0, visibility_timeout_s=2.0, poll_wait_s=0.5,
                                         adjust_interval_s=0.2))


@rayq.task(type="record")
def record(task_id):
    enter("record", task_id, name="restart")
    leave("record", name="restart")
    return task_id


def test_tasks_queued_before_a_restart_run_after_it_without_registering_again(
        ray_session, tmp_path_factory):
    client, data_dir = start_runtime(tmp_path_factory, CONFIG, name="restart")
    watcher = probe("restart")
    for i in range(5):
        client.submit(record, f"r{i}")  # no consumers yet: the tasks wait in the queue
    assert client.queue("tasks").count() == 5
    rayq.shutdown()

    client = rayq.start(data_dir=data_dir, config=CONFIG, consumers=2)
    deadline = time.monotonic() + 60
    while len(ray.get(watcher.report.remote())["attempts"]) < 5:
        assert time.monotonic() < deadline, ray.get(watcher.report.remote())
        time.sleep(0.1)
    assert sorted(ray.get(watcher.report.remote())["attempts"]) == [f"r{i}" for i in range(5)]
    while client.queue("tasks").count():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert ray.get(client.submit(record, "after"), timeout=60) == "after"
    rayq.shutdown()
