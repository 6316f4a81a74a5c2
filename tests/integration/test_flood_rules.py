"""The flood look-back and the type-level rule (docs/flood-detection.md) on real Ray with
scaled thresholds: look-back 1 s x 5, a type's queue over 300 flags its heavy tenants
(over 50 enqueues), over 500 the whole type. Nothing here asserts a timing: each step
polls what the runtime shows, with a deadline."""

import pytest
import ray

import rayq
from rayq.names import namespace, shard_name
from rayq.config import Config, ConsumerConfig, FloodConfig
from tests.integration.conftest import start_runtime, wait_until
from tests.integration.flooding import Receiver, send

FLOOD = FloodConfig(window_s=1.0, windows=5, interval_s=0.5, depth_threshold=300,
                    enqueue_threshold=50, type_depth_threshold=500, sweep_batch=100,
                    healthy_depth=1_000, exit_dedicated=50, exit_shared=100)
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    config = Config(consumers=ConsumerConfig(count=0), flood=FLOOD)
    client, _ = start_runtime(tmp_path_factory, config, name="flood-rules")
    yield client
    rayq.shutdown()


def flooding(client, queue: str) -> set[str]:
    return {f.tenant for f in client.flooders() if f.queue == queue}


def counted_enqueues(tenant: str) -> float:
    """What the shards count in the look-back for ``tenant``, summed."""
    shards = [ray.get_actor(shard_name(i), namespace=namespace())
              for i in range(Config().store.shards)]
    return sum(sum(series) for counts in ray.get([s.enqueue_counts.remote() for s in shards])
               for (_, _, who), series in counts.items() if who == tenant)


def test_a_burst_inside_the_look_back_counts(client):
    q = client.create_queue("together", max_receives=None)
    send(q, "early", 100)
    send(q, "late", 250)  # depth 350: both sent over 50 within the look-back
    assert wait_until(lambda: flooding(client, "together") == {"early", "late"},
                      DEADLINE_S, what="both tenants flagged")


def test_a_burst_older_than_the_look_back_ages_out(client):
    q = client.create_queue("aged", max_receives=None)
    send(q, "early", 100)
    assert counted_enqueues("early") >= 100
    wait_until(lambda: counted_enqueues("early") == 0, DEADLINE_S,
               what="early's enqueues to leave the 5 s look-back")
    send(q, "late", 250)  # depth 350: only late sent over 50 within the look-back
    wait_until(lambda: "late" in flooding(client, "aged"), DEADLINE_S, what="late flagged")
    assert flooding(client, "aged") == {"late"}  # both would come in the same run


def test_a_type_flooding_across_many_small_tenants_is_a_type_level_flooder(client):
    q = client.create_queue("spread-thin", max_receives=None)
    tenants = [f"org{i}" for i in range(20)]
    sent = [mid for t in tenants for mid in send(q, t, 30)]  # 600 of "job", 30 a tenant
    wait_until(lambda: flooding(client, "spread-thin"), DEADLINE_S, what="a flooder")
    assert flooding(client, "spread-thin") == {"*"}  # the type; no tenant sent over 50
    [flooder] = [f for f in client.flooders() if f.queue == "spread-thin"]
    assert flooder.type == "job" and flooder.depth >= 600
    sent += [mid for t in tenants[:5] for mid in send(q, t, 10)]  # spilled while flagged
    receiver = Receiver("spread-thin")
    try:
        wait_until(lambda: set(sent) <= set(receiver.deliveries) and q.count() == 0,
                   DEADLINE_S, what="the drain")
    finally:
        receiver.stop()
    assert set(receiver.deliveries) == set(sent) and max(receiver.deliveries.values()) == 1
    wait_until(lambda: not flooding(client, "spread-thin"), DEADLINE_S,
               what="the type to leave the list")
