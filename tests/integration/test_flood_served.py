"""An isolated flooder is slowed, never starved, through the public API: on a shard
holding its dedicated subqueue behind the live one, every other receive serves the
dedicated one first (docs/flood-detection.md; the unit rule is
``rayq.core.flood.isolation.serving_order``)."""

import collections
import time

import rayq
from rayq.config import Config, ConsumerConfig, FloodConfig, StoreConfig
from tests.integration.conftest import start_runtime

FLOOD = FloodConfig(interval_s=0.5, depth_threshold=300, enqueue_threshold=1000)


def test_an_isolated_flooder_gets_every_other_receive_beside_a_quiet_tenant(
        ray_session, tmp_path_factory):
    config = Config(store=StoreConfig(shards=1), consumers=ConsumerConfig(count=0), flood=FLOOD)
    client, _ = start_runtime(tmp_path_factory, config, name="flood-served")
    queue = client.create_queue("work")
    for start in range(0, 2000, 500):
        queue.send_batch([rayq.Outgoing(start + i, tenant="A") for i in range(500)])
    deadline = time.monotonic() + 120
    while not any(f.tenant == "A" for f in client.flooders()):
        assert time.monotonic() < deadline, "tenant A was never listed as a flooder"
        time.sleep(0.2)
    while not any(sq.dedicated for sq in client.transport.route("work", refresh=True)[0].subqueues):
        assert time.monotonic() < deadline, "tenant A was never isolated"
        time.sleep(0.2)
    queue.send_batch([rayq.Outgoing(i, tenant="B") for i in range(200)])
    served = collections.Counter()
    for _ in range(40):
        got = queue.receive(max_messages=5)
        served.update(m.tenant for m in got)
        queue.delete_batch([m.receipt for m in got])
    assert served["A"] >= 80 and served["B"] >= 80, served
    rayq.shutdown()
