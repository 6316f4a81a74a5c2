"""Where handlers run, on real Ray: a type with Ray options runs each call as a Ray task
(its runtime environment, its resources' node, its working_dir), a plain type on the
consumers' threads; a handler's error stays its own; a type no node can take fails."""

import importlib
import os
import sys

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig

from .conftest import ScriptRun, run_script, start_runtime, wait_until

SCRIPT_RUNS = (ScriptRun("task_placement.py", takes_s=30),)  # its own cluster

# Two consumers hold one of the session's two CPUs: one is left for a Ray task's default 1.
CONFIG = Config(consumers=ConsumerConfig(count=2, visibility_timeout_s=2.0, poll_wait_s=0.5,
                                         retry_backoff_s=0.1, adjust_interval_s=0.2,
                                         defer_s=0.1))
ENV = {"env_vars": {"RAYQ_TEST_VAR": "x"}}


@rayq.task(type="env-in-ray-task", runtime_env=ENV)
def env_in_ray_task():
    return os.environ.get("RAYQ_TEST_VAR")


@rayq.task(type="env-on-thread")
def env_on_thread():
    return os.environ.get("RAYQ_TEST_VAR")


@rayq.task(type="raises-in-ray-task", num_cpus=0.25, max_receives=2)
def raises_in_ray_task(what):
    raise ValueError(f"bad {what}")


@rayq.task(type="async-in-ray-task", num_cpus=0)
async def async_in_ray_task(x):
    return x * 2


@rayq.task(type="needs-nowhere", resources={"nowhere": 1}, max_receives=2)
def needs_nowhere():
    return "ran"


@rayq.task(type="refused-by-ray", runtime_env={"env_vars": {"RAYQ_TEST_VAR": 1}})
def refused_by_ray():
    return "ran"


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="placement")
    return client


def test_a_type_with_a_runtime_env_runs_in_it_while_a_plain_type_does_not(client):
    refs = [client.submit(env_in_ray_task), client.submit(env_on_thread)]
    assert ray.get(refs, timeout=120) == ["x", None]


def test_a_handler_raising_in_a_ray_task_fails_with_its_own_error_type_and_message(client):
    with pytest.raises(rayq.TaskError) as failed:
        ray.get(client.submit(raises_in_ray_task, "input"), timeout=120)
    assert (failed.value.error_type, failed.value.error_message) == ("ValueError", "bad input")
    assert any(m.type == "raises-in-ray-task"
               for m in client.queue("tasks-dlq").peek(max_messages=100))


def test_a_coroutine_handler_runs_to_its_end_in_a_ray_task(client):
    assert ray.get(client.submit(async_in_ray_task, 21), timeout=120) == 42


def test_a_type_no_node_can_take_is_a_failed_delivery_not_a_task_pending_for_ever(client):
    with pytest.raises(rayq.TaskError) as failed:
        ray.get(client.submit(needs_nowhere), timeout=120)
    assert failed.value.error_type == "RuntimeFailure"
    assert "no live node" in failed.value.error_message
    assert "'nowhere': 1.0" in failed.value.error_message


def test_a_type_whose_ray_options_ray_refuses_is_disabled_alone(client):
    client.register(refused_by_ray)
    assert ray.get(client.submit(env_on_thread), timeout=120) is None  # others run
    stats = wait_until(lambda: [s for s in client.consumer_stats()
                                if "refused-by-ray" in s.unloadable], timeout_s=60,
                       what="the refused type among the consumers' unloadable types")
    assert "env_vars" in stats[0].unloadable["refused-by-ray"]


def test_a_handler_whose_module_is_only_in_the_types_working_dir_runs_there(client, tmp_path):
    # a job's directory: a module of tasks and the sibling module it imports, importable
    # in this driver only; the consumers could not load the handler themselves
    job = tmp_path / "job"
    job.mkdir()
    (job / "wd_helper_only_here.py").write_text("def shout(word):\n    return word.upper()\n")
    (job / "wd_tasks_only_here.py").write_text(
        "import rayq\nfrom wd_helper_only_here import shout\n\n\n"
        f"@rayq.task(type='from-working-dir', num_cpus=0, runtime_env={{'working_dir': {str(job)!r}}})\n"
        "def greet(word):\n    return shout(word)\n\n\n"
        "@rayq.task(type='from-job-on-thread')\n"
        "def greet_here(word):\n    return shout(word)\n")
    sys.path.insert(0, str(job))
    try:
        module = importlib.import_module("wd_tasks_only_here")
        ref = client.submit(module.greet, "hello")
        client.register(module.greet_here)
    finally:
        sys.path.remove(str(job))
    assert ray.get(ref, timeout=120) == "HELLO"
    stats = client.consumer_stats()
    assert any("No module named 'wd_" in s.unloadable.get("from-job-on-thread", "")
               for s in stats), stats  # the proof: the consumers cannot import the modules


def test_a_type_with_a_custom_resource_runs_on_the_node_that_has_it():
    # its own simulated cluster, in its own process (the test run's Ray is untouched)
    lines, done = run_script(*SCRIPT_RUNS)
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = lines[-1]
    assert result["ran_on"] == [result["special_node"]] * 3
