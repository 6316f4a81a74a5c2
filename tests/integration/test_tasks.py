"""The task API on real Ray: submit -> ray.get, failures, dead letters, kills, limits."""

import time

import pytest
import ray

import rayq
from rayq.remote import call
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime
from tests.integration.probe import enter, leave, probe

CONFIG = Config(consumers=ConsumerConfig(count=3, visibility_timeout_s=2.0, poll_wait_s=0.5,
                                         retry_backoff_s=0.1, adjust_interval_s=0.2, defer_s=0.1))


@rayq.task(type="add")
def add(a, b=0):
    return a + b


@rayq.task(type="echo")
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@rayq.task(type="boom", max_receives=3)
def boom(task_id):
    enter("boom", task_id)
    leave("boom")
    raise KeyError(f"no such thing as {task_id}")


@rayq.task(type="picky", max_receives=5, retry_on=(OSError,), no_retry_on=(ValueError,),
           backoff_s=0.05)
def picky(task_id, error):
    enter("picky", task_id)
    leave("picky")
    raise {"value": ValueError, "key": KeyError, "conn": ConnectionError}[error](task_id)


@rayq.task(type="opaque")
def opaque():
    return object()


@rayq.task(type="slow")
def slow(task_id, seconds):
    attempt = enter("slow", task_id)
    try:
        if attempt == 1:
            time.sleep(seconds)  # long enough for the test to kill this consumer
        return f"done {task_id}"
    finally:
        leave("slow")


@rayq.task(type="limited", concurrency=2)
def limited(task_id):
    enter("limited", task_id)
    try:
        time.sleep(0.2)
        return task_id
    finally:
        leave("limited")


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="tasks")
    yield client


def test_a_submitted_task_returns_its_handlers_value_through_ray_get(client):
    refs = [client.submit(add, i, b=i, tenant=f"t{i % 3}") for i in range(30)]
    assert all(isinstance(ref, ray.ObjectRef) for ref in refs)
    assert ray.get(refs, timeout=60) == [2 * i for i in range(30)]


def test_arguments_and_results_round_trip_as_msgpack_values(client):
    value = ray.get(client.submit(echo, b"\x00raw", "héllo", [1, {"k": None}], flag=True,
                                  tenant="acme"), timeout=60)
    assert value == {"args": [b"\x00raw", "héllo", [1, {"k": None}]], "kwargs": {"flag": True}}


def test_arguments_that_are_not_msgpack_values_are_refused_before_anything_is_stored(client):
    tasks = client.queue("tasks")
    before = tasks.count()
    with pytest.raises(rayq.InvalidMessage, match="msgpack-able"):
        client.submit(add, object())
    with pytest.raises(rayq.InvalidMessage):
        client.submit(len, [1])  # not a @rayq.task
    assert tasks.count() == before


def test_a_result_that_is_not_a_msgpack_value_is_reported_as_the_tasks_error(client):
    with pytest.raises(rayq.TaskError) as err:
        ray.get(client.submit(opaque), timeout=60)
    assert err.value.error_type == "InvalidMessage"
    assert "not msgpack-able" in err.value.error_message


def test_a_poison_task_is_retried_then_dead_lettered_and_ray_get_raises_its_error(client):
    watcher = probe()
    ref = client.submit(boom, "p1")
    with pytest.raises(rayq.TaskError) as err:
        ray.get(ref, timeout=60)
    assert (err.value.error_type, err.value.error_message) == ("KeyError", "'no such thing as p1'")
    assert isinstance(err.value, ray.exceptions.RayTaskError)
    assert ray.get(watcher.report.remote())["attempts"]["p1"] == 3
    dead = client.queue("tasks-dlq").peek(10)
    assert [m.type for m in dead].count("boom") == 1
    with pytest.raises(rayq.TaskError):  # the ref stays resolved: the same error, no new run
        ray.get(ref)
    assert ray.get(watcher.report.remote())["attempts"]["p1"] == 3


@pytest.mark.parametrize("error, attempts", [
    ("value", 1),  # in no_retry_on: fails at once
    ("key", 1),    # not in retry_on: fails at once
    ("conn", 5),   # a ConnectionError is an OSError: retried to the last delivery
])
def test_a_types_retry_rule_says_which_errors_are_retried(client, error, attempts):
    watcher = probe()
    task_id = f"r-{error}"
    with pytest.raises(rayq.TaskError):
        ray.get(client.submit(picky, task_id, error), timeout=60)
    assert ray.get(watcher.report.remote())["attempts"][task_id] == attempts
    assert [m.type for m in client.queue("tasks-dlq").peek(100)].count("picky") >= 1


def test_submit_many_gives_a_ref_per_call_in_order_and_a_failed_one_raises_alone(client):
    args = [(i, 100) for i in range(40)]
    refs = client.submit_many(add, args)
    assert ray.get(refs, timeout=60) == [i + 100 for i in range(40)]
    mixed = client.submit_many(echo, [(1,), (2,)]) + client.submit_many(boom, [("m1",)])
    assert ray.get(mixed[:2], timeout=60) == [{"args": [1], "kwargs": {}},
                                              {"args": [2], "kwargs": {}}]
    poisoned = client.submit_many(add, [(1, 1), ("x", 1), (3, 1)])  # "x" + 1 raises
    assert ray.get(poisoned[0], timeout=60) == 2 and ray.get(poisoned[2]) == 4
    with pytest.raises(rayq.TaskError) as err:
        ray.get(poisoned[1])
    assert err.value.error_type == "TypeError"
    with pytest.raises(rayq.TaskError):
        ray.get(mixed[2], timeout=60)


def test_a_consumer_killed_mid_handler_loses_nothing_and_the_ref_resolves_once(client):
    watcher = probe()
    ref = client.submit(slow, "k1", 30)
    deadline = time.monotonic() + 30
    while not (where := ray.get(watcher.report.remote())["where"].get("k1")):
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.05)
    ray.kill(ray.get_actor(where[0], namespace="rayq"), no_restart=False)
    assert ray.get(ref, timeout=90) == "done k1"
    report = ray.get(watcher.report.remote())
    assert report["attempts"]["k1"] == 2  # ran again after the visibility timeout
    assert ray.get(ref) == "done k1"


def test_a_concurrency_limited_type_never_runs_above_its_limit(client):
    watcher = probe()
    refs = [client.submit(limited, f"l{i}", tenant=f"t{i % 2}") for i in range(12)]
    assert sorted(ray.get(refs, timeout=120)) == sorted(f"l{i}" for i in range(12))
    assert ray.get(watcher.report.remote())["peak"]["limited"] <= 2
    rows = [r for r in client.task_stats() if r.type == "limited"]
    assert sum(r.succeeded for r in rows) >= 12
    assert sum(r.deferred for r in rows) > 0  # every refusal is counted


def test_handler_failures_and_successes_are_tallied_per_tenant_and_type(client):
    ray.get([client.submit(add, 1, tenant="tally") for _ in range(5)], timeout=60)
    [row] = [r for r in client.task_stats() if (r.tenant, r.type) == ("tally", "add")]
    assert row.succeeded == 5 and row.usage_s > 0 and row.wait_p99_s >= row.wait_p50_s >= 0


def test_scale_consumers_adds_and_removes_consumer_actors(client):
    assert client.scale_consumers(4) == 4
    deadline = time.monotonic() + 30
    while len(client.consumer_stats()) != 4:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.scale_consumers(2) == 2
    assert len(client.consumer_stats()) == 2
    assert ray.get(client.submit(add, 20, b=1), timeout=60) == 21
    with pytest.raises(rayq.InvalidMessage):
        client.scale_consumers(-1)
    client.scale_consumers(3)


@pytest.mark.parametrize("path", ["local channel", "ray"])
def test_a_malformed_batch_of_task_ends_is_refused_whole(client, path):
    link = client.transport.shards[0]
    end_many = link.end_many if path == "local channel" else link.handle.end_many
    for bad in ["finish", [("delete", ())], [("finish",)]]:
        with pytest.raises(rayq.InvalidMessage):
            call(lambda: end_many.remote(bad))
    [stale] = call(lambda: end_many.remote([("finish", ("A" * 64, b"x", None))]))
    assert isinstance(stale, rayq.ReceiptInvalid)
