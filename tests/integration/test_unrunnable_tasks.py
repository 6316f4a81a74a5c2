"""A task no consumer can run does not cycle for ever: an account cannot put a type
nobody registered into the shared task queue, and one that gets there anyway (the
admin put it) is dead-lettered once its grace has passed."""

import pytest

import rayq
from rayq.config import Config, ConsumerConfig

from .conftest import start_runtime, wait_until

CONFIG = Config(consumers=ConsumerConfig(count=1, poll_wait_s=0.5, defer_s=0.1,
                                         unrunnable_after_s=1.0))


@rayq.task(type="known")
def known():
    return "ran"


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
