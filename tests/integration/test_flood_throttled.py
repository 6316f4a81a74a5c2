"""A listed flooder's new messages are throttled through the public API
(FloodConfig.flooder_puts = "throttle"): past its rate its puts raise Throttled, other
tenants send on, and every message stored before and after is delivered
(docs/flood-detection.md)."""

import collections
import time

import pytest

import rayq
from rayq.config import Config, ConsumerConfig, FloodConfig, StoreConfig
from tests.integration.conftest import start_runtime

# a rate so low that, once a put took the bucket into debt, none passes during the test
FLOOD = FloodConfig(interval_s=0.5, depth_threshold=300, enqueue_threshold=1000,
                    flooder_puts="throttle", flooder_rate_per_s=0.001, flooder_burst=1)


def test_a_listed_flooder_is_throttled_and_loses_nothing(ray_session, tmp_path_factory):
    config = Config(store=StoreConfig(shards=1), consumers=ConsumerConfig(count=0), flood=FLOOD)
    client, _ = start_runtime(tmp_path_factory, config, name="flood-throttled")
    queue = client.create_queue("work")
    sent = collections.Counter()
    for start in range(0, 2000, 500):
        try:  # listed already: one more put goes through, the next is refused
            queue.send_batch([rayq.Outgoing(start + i, tenant="A") for i in range(500)])
            sent["A"] += 500
        except rayq.Throttled:
            break
    deadline = time.monotonic() + 120
    while not any(f.tenant == "A" for f in client.flooders()):
        assert time.monotonic() < deadline, "tenant A was never listed as a flooder"
        time.sleep(0.2)
    with pytest.raises(rayq.Throttled, match="flooder"):
        for _ in range(3):  # the shard may list A a moment after the detector does
            queue.send_batch([rayq.Outgoing(i, tenant="A") for i in range(10)])
            sent["A"] += 10
            time.sleep(1.0)
    queue.send_batch([rayq.Outgoing(i, tenant="B") for i in range(200)])
    sent["B"] += 200
    got = collections.Counter()
    while got != sent:  # spilled messages come back with the sweeper
        assert time.monotonic() < deadline + 120, (got, sent)
        batch = queue.receive(max_messages=10, wait_s=0.5)
        got.update(m.tenant for m in batch)
        if batch:
            queue.delete_batch([m.receipt for m in batch])
    rayq.shutdown()
