"""A task no consumer can run does not cycle for ever: an account cannot put a type
nobody registered into the shared task queue, and one that gets there anyway (the
admin put it) is dead-lettered once its grace has passed. A handler the consumers
cannot load disables its own type only, and a result that cannot be stored fails its
task once, without running the handler again."""

import importlib
import sys

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig

from .conftest import start_runtime, wait_until

CONFIG = Config(consumers=ConsumerConfig(count=1, poll_wait_s=0.5, defer_s=0.1,
                                         unrunnable_after_s=1.0))


@rayq.task(type="known")
def known():
    return "ran"


@rayq.task(type="set-result", max_receives=5)
def set_result(path: str):
    with open(path, "a") as runs:
        runs.write("ran\n")
    return {3}  # a set: no value rayq carries


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="unrunnable")
    client.register(known)
    return client


def test_an_account_cannot_put_an_unregistered_type_into_the_task_queue(client):
    acme = rayq.connect(account="acme", key=client.create_account("acme"))
    tasks = acme.queue("default/tasks")
    with pytest.raises(rayq.AuthError, match="registered"):
        tasks.send(b"junk", type="nobody-runs-this")
    assert all(m.type != "nobody-runs-this" for m in client.queue("tasks").peek(max_messages=100))


def test_a_task_nobody_can_run_is_dead_lettered_after_its_grace(client):
    client.queue("tasks").send(b"junk", type="orphan")
    dead = wait_until(lambda: [m for m in client.queue("tasks-dlq").peek(max_messages=100)
                               if m.type == "orphan"], timeout_s=60,
                      what="the orphan task in the dead-letter queue")
    assert len(dead) == 1
    assert all(m.type != "orphan" for m in client.queue("tasks").peek(max_messages=100))


def test_a_handler_the_consumers_cannot_load_disables_its_own_type_only(client, tmp_path):
    # a job's own module, importable in this driver only (as with --working-dir code
    # that the runtime's consumers were not started with)
    (tmp_path / "jobmod_only_here.py").write_text("def handler():\n    return 'job'\n")
    sys.path.insert(0, str(tmp_path))
    try:
        jobmod = importlib.import_module("jobmod_only_here")
        broken = rayq.task(type="from-job")(jobmod.handler)
        ref = client.submit(broken)
    finally:
        sys.path.remove(str(tmp_path))
    assert ray.get(client.submit(known), timeout=60) == "ran"  # every other type runs
    with pytest.raises(rayq.TaskError) as failed:
        ray.get(ref, timeout=60)
    assert failed.value.error_type == "ModuleNotFoundError"
    assert "'from-job' cannot be loaded" in failed.value.error_message
    assert any(m.type == "from-job" for m in client.queue("tasks-dlq").peek(max_messages=100))
    stats = client.consumer_stats()
    assert any("from-job" in s.unloadable and "jobmod_only_here" in s.unloadable["from-job"]
               for s in stats), stats
    assert sum(s.background_failures for s in stats) >= 1  # counted
    assert ray.get(client.submit(known), timeout=60) == "ran"


def test_a_result_that_cannot_be_stored_fails_its_task_once(client, tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(rayq.TaskError, match="not msgpack-able"):
        ray.get(client.submit(set_result, str(runs)), timeout=60)
    assert runs.read_text() == "ran\n"  # its side effects happened once
