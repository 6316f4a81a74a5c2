"""Subqueues are added under load and retired, drained and dropped when idle."""

import time

import rayq
from tests.integration.conftest import start_runtime, wait_until

FAST_SCALING = rayq.ScalingConfig(interval_s=0.2, scale_up_ops_per_s=10, idle_s=1.0,
                                  max_subqueues=3)


def live_subqueues(queue):
    return [s for s in queue.stats().subqueues if s["state"] != "disabled"]


def test_subqueues_scale_up_under_load_and_down_when_idle_losing_nothing(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, rayq.Config(scaling=FAST_SCALING))
    queue = client.create_queue("elastic", max_receives=None)
    sent = []
    deadline = time.monotonic() + 20
    while len(live_subqueues(queue)) < 2 and time.monotonic() < deadline:
        producer = rayq.connect().queue("elastic")  # new transports spread over subqueues
        for _ in range(20):  # requests make a subqueue busy, whatever their batches
            sent += producer.send_batch([rayq.Outgoing(len(sent) + i) for i in range(25)])
    assert len(live_subqueues(queue)) >= 2, "no subqueue was added under load"

    received = []
    while queue.count():
        got = queue.receive(max_messages=500, visibility_timeout_s=30)
        received += [m.id for m in got]
        queue.delete_batch([m.receipt for m in got])
    assert sorted(received) == sorted(sent)

    wait_until(lambda: len(live_subqueues(queue)) == 1, what="idle subqueues to be dropped")
    events = {e["event"] for e in ray_session.get(
        ray_session.get_actor("rayq-manager", namespace="rayq").info.remote())["scaling_events"]}
    assert {"add", "retire", "drop"} <= events
    queue.send("still works")
    assert [m.body for m in queue.receive()] == ["still works"]
