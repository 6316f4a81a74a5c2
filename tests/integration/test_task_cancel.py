"""Cancelling tasks and per-task time limits on real Ray, with real handlers: a queued
task never runs, a running one is told and stopped, a slot is free afterwards, and a
handler past its limit fails with TaskTimedOut under its type's retry rule."""

import asyncio
import os
import time

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime, wait_until

CONFIG = Config(consumers=ConsumerConfig(count=2, visibility_timeout_s=5.0, poll_wait_s=0.5,
                                         retry_backoff_s=0.1, adjust_interval_s=0.2))


def mark(folder, name):
    with open(os.path.join(folder, name), "a") as f:
        f.write(f"{rayq.current_task().attempt}\n")


def marked(folder, name):
    return os.path.exists(os.path.join(folder, name))


def sleep_in_steps(seconds):
    """Python-level sleeping: a raised HandlerStopped lands within a step."""
    for _ in range(int(seconds * 10)):
        time.sleep(0.1)


@rayq.task(type="cancel_polite", concurrency=1)
def polite(folder, name, seconds=120):
    mark(folder, name + ".started")
    for _ in range(int(seconds * 10)):
        if rayq.current_task().cancelled:
            mark(folder, name + ".saw-cancel")
            return "stopped early"
        time.sleep(0.1)
    mark(folder, name + ".ended")
    return "ran"


@rayq.task(type="cancel_stubborn", concurrency=1, cancel_grace_s=1)
def stubborn(folder, name, seconds=120):
    mark(folder, name + ".started")
    sleep_in_steps(seconds)
    mark(folder, name + ".ended")
    return "ran"


@rayq.task(type="cancel_async")
async def patient(folder, name):
    mark(folder, name + ".started")
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        mark(folder, name + ".cancelled-error")
        raise
    mark(folder, name + ".ended")


@rayq.task(type="cancel_limited", time_limit_s=2, max_receives=1, cancel_grace_s=1)
def limited(folder, name, seconds=30):
    sleep_in_steps(seconds)
    mark(folder, name + ".ended")
    return "ran"


@rayq.task(type="cancel_lowered", time_limit_s=600, max_receives=1, cancel_grace_s=1)
def lowered(folder, name, seconds=30):
    sleep_in_steps(seconds)
    mark(folder, name + ".ended")
    return "ran"


@rayq.task(type="cancel_retried", time_limit_s=1, max_receives=2, retry_on=(rayq.TaskTimedOut,),
           cancel_grace_s=1)
def retried(folder, name):
    mark(folder, name + ".tries")
    sleep_in_steps(30)
    return "ran"


@rayq.task(type="cancel_not_retried", time_limit_s=1, max_receives=3,
           no_retry_on=(rayq.TaskTimedOut,), cancel_grace_s=1)
def not_retried(folder, name):
    mark(folder, name + ".tries")
    sleep_in_steps(30)
    return "ran"


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="task-cancel")
    yield client
    rayq.shutdown()


@pytest.fixture
def folder(tmp_path):
    return str(tmp_path)


def tries(folder, name):
    with open(os.path.join(folder, name + ".tries")) as f:
        return len(f.read().split())


def test_a_queued_task_cancelled_never_runs_and_its_ref_raises_task_cancelled(client, folder):
    ref = client.submit(polite, folder, "queued", delay_s=60)
    task_id = client.task_id(ref)
    assert client.cancel(task_id) is True
    with pytest.raises(rayq.TaskCancelled):
        ray.get(ref, timeout=60)
    with pytest.raises(rayq.TaskCancelled):
        client.result(task_id, timeout_s=60)
    assert client.task(task_id).state == "cancelled"
    assert client.cancel(task_id) is False  # it had ended
    assert not marked(folder, "queued.started")


def test_cancelling_an_unknown_task_raises_task_not_found(client):
    with pytest.raises(rayq.TaskNotFound):
        client.cancel("no-such-task")


def cancelled_while_running(client, fn, folder: str, name: str, timeout_s: float):
    """Submit ``fn(folder, name)``, cancel it once its handler started, and check its ref
    raises TaskCancelled; the ref."""
    ref = client.submit(fn, folder, name)
    wait_until(lambda: marked(folder, f"{name}.started"), 60, what="the handler started")
    assert client.cancel(client.task_id(ref)) is True
    with pytest.raises(rayq.TaskCancelled):
        ray.get(ref, timeout=timeout_s)
    return ref


def test_a_running_handler_sees_the_cancel_and_its_slot_is_free_afterwards(client, folder):
    ref = cancelled_while_running(client, polite, folder, "polite", 60)
    assert marked(folder, "polite.saw-cancel") and not marked(folder, "polite.ended")
    assert client.task(client.task_id(ref)).state == "cancelled"
    # concurrency=1: the next task of the type runs only once the lease was released
    assert ray.get(client.submit(polite, folder, "next", 0.2), timeout=120) == "ran"


def test_a_handler_that_ignores_the_cancel_is_stopped_after_its_grace(client, folder):
    cancelled_while_running(client, stubborn, folder, "stubborn", 90)
    assert ray.get(client.submit(stubborn, folder, "after", 0.2), timeout=120) == "ran"
    assert not marked(folder, "stubborn.ended")


def test_an_async_handler_has_its_coroutine_cancelled(client, folder):
    cancelled_while_running(client, patient, folder, "async", 60)
    assert marked(folder, "async.cancelled-error") and not marked(folder, "async.ended")


def test_a_handler_past_its_time_limit_fails_with_task_timed_out(client, folder):
    began = time.monotonic()
    ref = client.submit(limited, folder, "limited")
    with pytest.raises(rayq.TaskTimedOut) as err:
        ray.get(ref, timeout=120)
    assert err.value.error_type == "TaskTimedOut"
    assert time.monotonic() - began < 25  # well before the handler's 30 s
    assert not marked(folder, "limited.ended")
    assert client.task(client.task_id(ref)).state == "failed"


def test_submit_lowers_the_types_time_limit_but_may_not_raise_it(client, folder):
    ref = client.submit(lowered, folder, "lowered", time_limit_s=2)
    with pytest.raises(rayq.TaskTimedOut):
        ray.get(ref, timeout=120)
    assert not marked(folder, "lowered.ended")
    with pytest.raises(rayq.InvalidMessage):
        client.submit(limited, folder, "raised", time_limit_s=5)
    assert ray.get(client.submit(lowered, folder, "short", 0.2, time_limit_s=30),
                   timeout=120) == "ran"


def test_the_types_retry_rule_applies_to_a_timed_out_call(client, folder):
    again = client.submit(retried, folder, "retried")
    once = client.submit(not_retried, folder, "once")
    for ref in (again, once):
        with pytest.raises(rayq.TaskTimedOut):
            ray.get(ref, timeout=180)
    assert tries(folder, "retried") == 2  # retried up to its max_receives
    assert tries(folder, "once") == 1     # no_retry_on: failed at once
