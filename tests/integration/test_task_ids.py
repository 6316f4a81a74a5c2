"""Tasks by id on real Ray: ids, idempotent submits, lookups by any process of the
account, results by id, and refs that outlive their desk and their shard's leader."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import ray

import rayq
from rayq.names import namespace, outcome_desk_name, shard_name
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime, wait_until
from tests.integration.probe import enter, leave, probe

CONFIG = Config(consumers=ConsumerConfig(count=2, visibility_timeout_s=5.0, poll_wait_s=0.5,
                                         retry_backoff_s=0.1, adjust_interval_s=0.2))


@rayq.task(type="ids_add")
def add(a, b=0):
    return a + b


@rayq.task(type="ids_counted")
def counted(task_id, value):
    enter("ids_counted", task_id)
    leave("ids_counted")
    return value


@rayq.task(type="ids_slow")
def slow(seconds, value):
    time.sleep(seconds)
    return value


@rayq.task(type="ids_fails", max_receives=1)
def fails():
    raise ValueError("no good")


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="task-ids")
    probe()
    yield client
    rayq.shutdown()


def test_a_submitted_task_is_found_by_its_id_and_its_result_read_by_it(client):
    ref = client.submit(add, 2, 3)
    task_id = client.task_id(ref)
    assert ray.get(ref, timeout=60) == 5
    assert client.result(task_id, timeout_s=60) == 5
    assert ray.get(client.ref(task_id), timeout=60) == 5
    info = client.task(task_id)
    assert (info.id, info.type, info.tenant, info.state) == (task_id, "ids_add", "default",
                                                             "succeeded")
    assert info.attempts == 1 and info.submitted_at <= info.started_at <= info.ended_at


def test_a_task_submitted_again_under_its_id_runs_once(client):
    first = client.submit(counted, "once", 1, task_id="order-17")
    again = client.submit(counted, "once", 2, task_id="order-17")
    assert ray.get([first, again], timeout=60) == [1, 1]
    assert client.task_id(again) == "order-17"
    assert ray.get(probe().report.remote())["attempts"]["once"] == 1
    [third] = client.submit_many(counted, [("once", 3)], task_ids=["order-17"])
    assert ray.get(third, timeout=60) == 1


def test_a_failed_task_reads_as_failed_and_its_result_raises_its_error(client):
    ref = client.submit(fails, task_id="doomed")
    with pytest.raises(rayq.TaskError, match="no good"):
        ray.get(ref, timeout=60)
    with pytest.raises(rayq.TaskError, match="ValueError"):
        client.result("doomed", timeout_s=60)
    assert client.task("doomed").state == rayq.TaskState.FAILED


def test_a_running_task_reads_as_running_and_a_short_wait_for_it_times_out(client):
    client.submit(slow, 3.0, "late", task_id="slow-1")
    wait_until(lambda: client.task("slow-1").state == "running", what="the task to start")
    with pytest.raises(rayq.ResultTimeout):
        client.result("slow-1", timeout_s=0.2)
    assert client.result("slow-1", timeout_s=60) == "late"


def test_unknown_and_malformed_ids_are_refused_clearly(client):
    with pytest.raises(rayq.TaskNotFound):
        client.task("never-submitted")
    with pytest.raises(rayq.TaskNotFound):
        client.result("never-submitted")
    with pytest.raises(rayq.InvalidMessage):
        client.task("")
    with pytest.raises(rayq.InvalidMessage):
        client.submit(add, 1, task_id="bad\nid")
    with pytest.raises(rayq.TaskNotFound):
        client.task_id(ray.put(1))


def test_an_account_sees_its_own_task_ids_only(client):
    key = client.create_account("idsacct")
    other = rayq.connect(account="idsacct", key=key)
    mine = other.submit(add, 40, 2, task_id="shared-name")
    theirs = client.submit(add, 1, 1, task_id="shared-name")
    assert ray.get([mine, theirs], timeout=60) == [42, 2]
    assert other.result("shared-name", timeout_s=60) == 42
    assert client.result("shared-name", timeout_s=60) == 2
    assert other.task("shared-name").tenant == "idsacct"
    with pytest.raises(rayq.TaskNotFound):
        other.task(client.task_id(client.submit(add, 0)))


def test_refs_resolve_when_their_desk_and_their_shard_leader_are_killed(client):
    refs = [client.submit(slow, 1.0, i) for i in range(4)]
    for index in range(client.config.store.shards):
        for name in (outcome_desk_name(index), shard_name(index)):
            try:
                ray.kill(ray.get_actor(name, namespace=namespace()), no_restart=False)
            except ValueError:
                pass  # no ref waits on this shard: its desk never started
    assert ray.get(refs, timeout=120) == [0, 1, 2, 3]


def test_a_new_driver_reads_the_results_of_one_that_exited(client, tmp_path):
    script = textwrap.dedent("""
        import ray, rayq
        from tests.integration.test_task_ids import add
        client = rayq.connect(address="auto")
        client.submit(add, 20, 1, task_id="from-a-driver-that-left")
        print("submitted")
    """)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert "submitted" in done.stdout, done.stderr[-2000:]
    assert client.result("from-a-driver-that-left", timeout_s=60) == 21


def test_a_task_that_ended_before_its_desk_restarted_is_read_from_its_shard(client):
    assert ray.get(client.submit(add, 5, 5, task_id="before-restart"), timeout=60) == 10
    shard, _ = client._tasks.find("before-restart")
    desk = ray.get_actor(outcome_desk_name(shard), namespace=namespace())
    ray.kill(desk, no_restart=False)  # it comes back knowing no end: it reads the shard
    assert client.result("before-restart", timeout_s=60) == 10


@rayq.task(type="ids_usage")
def used(x):
    return x


def test_the_usage_of_a_task_outlives_the_consumer_that_ran_it(client):
    """Its report went to the shard with the task's end: killing every consumer right
    after loses none (they are started again by the manager afterwards)."""
    from actors.consumer import named_consumers
    assert ray.get(client.submit_many(used, [(1,), (2,)]), timeout=60) == [1, 2]
    for handle in named_consumers().values():
        ray.kill(handle, no_restart=True)
    rows = {row.type: row for row in client.task_stats(by="type")}
    assert rows["ids_usage"].succeeded == 2
