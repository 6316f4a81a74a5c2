"""The flood rules of docs/flood-detection.md on real Ray with scaled thresholds (type
queue depth 300, enqueues 50, exit 50): a flood spread over several tenants of one type, a flooder
back to a trickle, and clear() in the middle of a flood. Nothing here asserts a
timing: each step polls what the runtime shows, with a deadline."""

import threading
import time

import pytest
import ray

import rayq
from rayq.names import FLOOD_DETECTOR, namespace
from rayq.config import Config, ConsumerConfig, FloodConfig
from tests.integration.conftest import start_runtime
from tests.integration.flooding import Receiver, send

FLOOD = FloodConfig(window_s=1.0, windows=10, interval_s=0.5, depth_threshold=300,
                    enqueue_threshold=50, type_depth_threshold=1_000_000, sweep_batch=100,
                    healthy_depth=1_000, exit_dedicated=50, exit_shared=500)
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, Config(consumers=ConsumerConfig(count=0),
                                                       flood=FLOOD), name="flood-seed")
    yield client
    rayq.shutdown()


def wait_for(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def flooding(client, queue: str) -> dict[str, rayq.Flooder]:
    return {f.tenant: f for f in client.flooders() if f.queue == queue}


def test_a_flood_spread_over_tenants_of_one_type_is_found_and_drained(client):
    q = client.create_queue("spread", max_receives=None)
    heavy = [f"org{i}" for i in range(4)]  # 4 x 120: no tenant alone near the depth of 300
    sent = [mid for t in heavy for mid in send(q, t, 120)] + send(q, "calm", 20)
    wait_for(lambda: set(heavy) <= set(flooding(client, "spread")), "the heavy tenants flagged")
    found = flooding(client, "spread")
    assert set(found) == set(heavy)  # calm (20 enqueues) is not a flooder
    assert len({f.since for f in found.values()}) == 1  # all in the same detection run
    sent += [mid for t in heavy for mid in send(q, t, 50)]  # spilled while flagged
    receiver = Receiver("spread")
    wait_for(lambda: set(sent) <= set(receiver.deliveries) and q.count() == 0, "the drain")
    receiver.stop()
    assert set(receiver.deliveries) == set(sent)  # nothing lost, nothing extra
    assert max(receiver.deliveries.values()) == 1  # nothing delivered twice
    assert sum(s.store.spilled for s in client.stats()) > 0


def test_a_flooder_back_to_a_trickle_leaves_the_list(client):
    q = client.create_queue("trickle", max_receives=None)
    sent = send(q, "big", 400)
    wait_for(lambda: "big" in flooding(client, "trickle"), "the flood detected")
    receiver = Receiver("trickle")
    stop = threading.Event()

    def trickle():  # about five a second, the flood is over
        producer = rayq.connect().queue("trickle")
        while not stop.is_set():
            sent.append(producer.send("drop", tenant="big", type="job"))
            time.sleep(0.2)

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        def events():
            return [e["event"] for e in client.flood_events()
                    if e["queue"] == "trickle" and e["tenant"] == "big"]

        wait_for(lambda: "big" not in flooding(client, "trickle") and "removed" in events(),
                 "the trickle to leave the list")
        assert events()[0] == "detected" and events().count("removed") == 1
    finally:
        stop.set()
        sender.join()
    wait_for(lambda: set(sent) <= set(receiver.deliveries) and q.count() == 0, "the drain")
    receiver.stop()
    assert set(receiver.deliveries) == set(sent) and max(receiver.deliveries.values()) == 1


def test_clear_during_a_flood_leaves_nothing_and_nothing_comes_back(client):
    q = client.create_queue("cleared", max_receives=None)
    send(q, "big", 400)
    wait_for(lambda: "big" in flooding(client, "cleared"), "the flood detected")
    spilled_before = sum(s.store.spilled for s in client.stats())
    send(q, "big", 150)  # to the spill store
    assert sum(s.store.spilled for s in client.stats()) == spilled_before + 150
    q.clear()
    assert q.count() == 0 and rayq.connect().queue("cleared").count() == 0
    wait_for(lambda: "big" not in flooding(client, "cleared"), "the flooder to leave")
    detector = ray.get_actor(FLOOD_DETECTOR, namespace=namespace())
    for _ in range(3):  # several more detection runs, each sweeping what is spilled
        ray.get(detector.detect_once.remote())
        assert q.count() == 0 and q.peek(10) == [] and q.receive(10) == []
    # the shards' background removal ends with every cleared row gone from disk
    wait_for(lambda: sum(s.store.messages for s in client.stats()) == 0, "the removal")
    assert q.count() == 0
    mid = q.send("after", tenant="big", type="job")
    assert [m.id for m in q.receive(wait_s=5)] == [mid]
