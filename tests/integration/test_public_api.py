"""Public behaviour no other test pins down: delayed and side-queue tasks, task_stats by
tenant, the flooder list, consumer statistics, QueueExists, per-message delay and ttl
in send_batch, the shards' back-pressure, and attaching to a running runtime."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig, FloodConfig
from rayq.remote import call
from tests.integration.conftest import start_runtime, wait_until

CONSUMERS = ConsumerConfig(count=2, min_load=1, max_load=3, visibility_timeout_s=5.0,
                           poll_wait_s=0.3, adjust_interval_s=0.2, retry_backoff_s=0.1)
# scaled down so one burst of FLOOD_BURST messages makes a flooder
FLOOD = FloodConfig(window_s=1.0, windows=10, interval_s=0.3, depth_threshold=100,
                    enqueue_threshold=100, type_depth_threshold=1_000_000,
                    healthy_depth=1_000_000, exit_dedicated=1, exit_shared=1)
FLOOD_BURST = 300
ROOT = Path(__file__).resolve().parents[2]


@rayq.task(type="plus")
def plus(a, b=0):
    return a + b


@rayq.task(type="times")
def times(a, b):
    return a * b


@rayq.task(type="side", queue="side-jobs")
def side(x):
    return ["side", x]


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, Config(consumers=CONSUMERS, flood=FLOOD),
                              name="public")
    yield client


# -- tasks ---------------------------------------------------------------------------------
def test_a_task_declared_on_another_queue_travels_and_runs_there(client):
    tasks_before = client.queue("tasks").count() if "tasks" in client.list_queues() else 0
    parked = client.submit(side, 0, delay_s=3600)  # stays put, so we can see where it went
    assert client.queue("side-jobs").count() == 1
    assert ray.get(client.submit(side, 7), timeout=60) == ["side", 7]
    assert client.queue("side-jobs").count() == 1  # the run one is gone, the parked one stays
    if "tasks" in client.list_queues():
        assert client.queue("tasks").count() == tasks_before
    assert not ray.wait([parked], timeout=0)[0]


def test_a_delayed_task_waits_out_its_delay_and_then_runs(client):
    parked = client.submit(plus, 1, b=1, delay_s=3600)
    assert ray.get(client.submit(plus, 2, b=2, delay_s=0.5), timeout=60) == 4
    tasks = client.queue("tasks")
    assert tasks.count() == 1 and tasks.peek(5) == []  # stored, not visible to consumers
    assert not ray.wait([parked], timeout=0)[0]
    with pytest.raises(rayq.InvalidMessage):
        client.submit(plus, 1, delay_s=-1)


def test_task_stats_by_tenant_adds_up_each_tenants_types(client):
    refs = [client.submit(plus, i, tenant="stats-a") for i in range(3)]
    refs += [client.submit(times, 2, 3, tenant="stats-a"), client.submit(plus, 5, tenant="stats-b")]
    ray.get(refs, timeout=60)
    pairs = [r for r in client.task_stats() if r.tenant in ("stats-a", "stats-b")]
    assert {(r.tenant, r.type, r.succeeded) for r in pairs} == {
        ("stats-a", "plus", 3), ("stats-a", "times", 1), ("stats-b", "plus", 1)}
    by_tenant = {r.tenant: r for r in client.task_stats(by="tenant")}
    a, b = by_tenant["stats-a"], by_tenant["stats-b"]
    assert (a.type, a.succeeded, a.failed, a.dead) == ("*", 4, 0, 0)
    assert (b.type, b.succeeded) == ("*", 1)
    assert a.usage_s == pytest.approx(sum(r.usage_s for r in pairs if r.tenant == "stats-a"))
    assert a.wait_p99_s >= a.wait_p50_s >= 0
    with pytest.raises(rayq.InvalidMessage):
        client.task_stats(by="queue")


def test_consumer_stats_describe_every_running_consumer(client):
    ray.get([client.submit(plus, i) for i in range(20)], timeout=60)
    stats = client.consumer_stats()
    assert [s.index for s in stats] == list(range(CONSUMERS.count))
    for s in stats:
        assert CONSUMERS.min_load <= s.load <= CONSUMERS.max_load
        assert 0.0 <= s.hit_rate <= 1.0
        assert s.polls >= s.hits >= 0 and s.empty_polls == s.polls - s.hits
        assert s.running >= 0 and s.deferrals >= 0 and s.lost >= 0
        assert s.background_failures >= 0 and s.plan_version is not None
    assert sum(s.hits for s in stats) >= 1  # the twenty tasks came through some poll


# -- queues ----------------------------------------------------------------------------------
def test_creating_a_queue_again_with_other_settings_raises_queue_exists(client):
    queue = client.create_queue("exists", max_receives=3)
    queue.send("kept")
    assert client.create_queue("exists", max_receives=3).name == "exists"  # same: idempotent
    for other in (4, None):
        with pytest.raises(rayq.QueueExists):
            client.create_queue("exists", max_receives=other)
    assert issubclass(rayq.QueueExists, rayq.UsageError)
    assert queue.count() == 1


def test_send_batch_honours_each_messages_delay_and_time_to_live(client):
    queue = client.create_queue("per-message")
    ids = queue.send_batch([rayq.Outgoing("now"), rayq.Outgoing("next hour", delay_s=3600),
                            rayq.Outgoing("short-lived", ttl_s=0.3),
                            rayq.Outgoing("soon", delay_s=0.5, ttl_s=3600)])
    assert len(set(ids)) == 4
    wait_until(lambda: sorted(m.body for m in queue.peek(10)) == ["now", "soon"],
               what="the short-lived one to expire and the delayed one to show")
    assert sorted(m.body for m in queue.receive(max_messages=10)) == ["now", "soon"]
    wait_until(lambda: queue.count() == 3, what="the shard to collect the expired message")
    assert queue.receive(max_messages=10) == []  # "next hour" is stored but not visible
    for bad in (rayq.Outgoing("x", delay_s=-1), rayq.Outgoing("x", ttl_s=0),
                rayq.Outgoing("x", delay_s="1")):
        with pytest.raises(rayq.InvalidMessage):
            queue.send_batch([rayq.Outgoing("fine"), bad])
    assert queue.count() == 3  # a refused batch stores none of its messages


def test_a_flooding_tenant_is_listed_with_its_queue_type_and_tenant(client):
    queue = client.create_queue("floody", max_receives=None)
    before = time.time()
    for _ in range(FLOOD_BURST // 100):
        queue.send_batch([rayq.Outgoing(i, tenant="big", type="bulk") for i in range(100)])
    queue.send_batch([rayq.Outgoing(i, tenant="small", type="bulk") for i in range(5)])
    flooders = wait_until(lambda: [f for f in client.flooders() if f.queue == "floody"],
                          what="the flood detector to list the flooder")
    [flooder] = flooders
    assert (flooder.queue, flooder.type, flooder.tenant) == ("floody", "bulk", "big")
    assert not flooder.type_level and flooder.covers("bulk", "big")
    assert not flooder.covers("bulk", "small")
    assert before <= flooder.since <= time.time()
    assert flooder.spilled >= 0 and 0 <= flooder.depth <= FLOOD_BURST
    # isolating moves messages, it loses none (stats() routes afresh: count() may still
    # use a route from before the dedicated subqueue was made)
    assert queue.stats().depth == FLOOD_BURST + 5


# -- back-pressure ---------------------------------------------------------------------------
def test_a_shard_with_too_many_calls_waiting_refuses_more_with_overloaded(client):
    queue = client.create_queue("pressure")
    queue.send("kept")
    shard = client.transport.shards[0]
    flood_of_calls = [("change_visibility", ("A" * 64, 0))] * 10_001  # over MAX_PENDING_CALLS
    with pytest.raises(rayq.Overloaded):
        call(lambda: shard.end_many.remote(flood_of_calls))
    assert issubclass(rayq.Overloaded, rayq.RuntimeFailure)  # "it broke", retry later
    assert queue.count() == 1 and [m.body for m in queue.receive()] == ["kept"]


# -- attaching ---------------------------------------------------------------------------------
def test_start_reuses_a_running_runtime_with_its_own_configuration(client, tmp_path):
    client.create_queue("seen-by-both").send("hello")
    again = rayq.start(data_dir=tmp_path / "ignored", config=Config())
    assert again.transport.manager.handle._actor_id == client.transport.manager.handle._actor_id
    assert again.config == client.config and again.config.consumers == CONSUMERS
    assert again.queue("seen-by-both").count() == 1
    assert len(again.consumer_stats()) == CONSUMERS.count
    assert not (tmp_path / "ignored").exists()


def test_connect_with_an_address_attaches_from_another_process(ray_session, client):
    queue = client.create_queue("from-afar")
    address = ray_session.get_runtime_context().gcs_address
    script = ("import sys, rayq\n"
              "q = rayq.connect(address=sys.argv[1]).queue('from-afar')\n"
              "print(q.send('over the wire', tenant='remote'))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, address], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    mid = done.stdout.strip().splitlines()[-1]
    [got] = queue.receive()
    assert (got.id, got.body, got.tenant) == (mid, "over the wire", "remote")
