"""A busy queue with a subqueue on every shard adds a shard (a writer) for its next
subqueue, up to store.max_shards; the added shard keeps its messages across restarts."""

import gc

import ray
import ray.experimental.internal_kv as internal_kv

import rayq
from rayq.config import with_consumers
from rayq.names import namespace
from rayq.remote import PLACEMENT_KEY
from tests.integration.conftest import start_runtime, wait_until

CONFIG = with_consumers(rayq.Config(
    store=rayq.StoreConfig(shards=1, max_shards=2),
    scaling=rayq.ScalingConfig(interval_s=0.2, scale_up_ops_per_s=10, idle_s=3600,
                               max_subqueues=2)), 0)


def shards_of(queue) -> list[int]:
    return sorted(s["shard"] for s in queue.stats().subqueues if s["state"] != "disabled")


def drain(queue) -> list:
    """Every message the queue holds, received and deleted."""
    bodies = []
    while queue.count():
        got = queue.receive(max_messages=500, visibility_timeout_s=60)
        bodies += [m.body for m in got]
        queue.delete_batch([m.receipt for m in got])
    return bodies


def busy_until_on_two_shards(client) -> list[int]:
    queue, sent = client.queue("busy"), 0

    def loaded():
        nonlocal sent
        gc.collect()  # the last producer's transport, if only a cycle held it
        producer = rayq.connect().queue("busy")  # a new transport: routed anew
        for _ in range(10):  # requests make a subqueue busy, whatever their batches
            producer.send_batch([rayq.Outgoing(sent + i) for i in range(10)])
            sent += 10
        return shards_of(queue) if 1 in shards_of(queue) else None

    return wait_until(loaded, timeout_s=120, interval_s=0.0, what="a subqueue on a new shard")


def test_a_busy_queue_grows_onto_a_new_shard_that_serves_and_survives_restarts(
        ray_session, tmp_path_factory):
    client, data_dir = start_runtime(tmp_path_factory, CONFIG, name="shard-scaling")
    client.create_queue("busy", max_receives=None)
    assert len(client.stats()) == 1
    assert busy_until_on_two_shards(client) == [0, 1]
    stats = client.stats()
    assert [s.index for s in stats] == [0, 1]
    info = ray.get(ray.get_actor("rayq-manager", namespace=namespace()).info.remote())
    assert info["shards"] == 2
    assert [e["shard"] for e in info["scaling_events"] if e["event"] == "add shard"] == [1]

    queue = client.queue("busy")
    drain(queue)
    assert on_shards(client) == {0: 0, 1: 0}

    # new producers spread over the subqueues: some of their messages go to the new shard,
    # and all of them are received and deleted
    fresh = spread_sends(client, "fresh")
    assert sorted(drain(queue)) == sorted(fresh)
    assert on_shards(client) == {0: 0, 1: 0}

    # left there across a restart: on the same data directory, and once Ray's record of
    # the places is gone too (the whole cluster restarted)
    kept = spread_sends(client, "kept")
    held = on_shards(client)
    for forget_places in (False, True):
        rayq.shutdown()
        if forget_places:
            internal_kv._internal_kv_del(PLACEMENT_KEY, namespace=namespace())
        client = rayq.start(data_dir=data_dir, config=CONFIG)
        assert [s.index for s in client.stats()] == [0, 1]
        assert shards_of(client.queue("busy")) == [0, 1]
        assert on_shards(client) == held
    queue = client.queue("busy")
    assert sorted(drain(queue)) == sorted(kept)
    queue.send("after")
    assert [m.body for m in queue.receive(wait_s=5)] == ["after"]


def on_shards(client) -> dict[int, int]:
    """Messages of queue ``busy`` on each shard."""
    return {s.index: s.queues.get("busy", 0) for s in client.stats()}


def spread_sends(client, tag: str) -> list:
    """Batches from new producers until the new shard holds some of them; every body sent."""
    bodies = []

    def sent_to_new_shard():
        batch = [f"{tag}-{len(bodies) + i}" for i in range(10)]
        gc.collect()  # the last producer's transport, if only a cycle held it: a new session
        rayq.connect().queue("busy").send_batch([rayq.Outgoing(b) for b in batch])
        bodies.extend(batch)
        return on_shards(client)[1] > 0

    wait_until(sent_to_new_shard, timeout_s=120, what=f"{tag} messages on the new shard")
    return bodies
