"""Rules of the source texts through the public API, on one shard with scaled flood
thresholds: an isolated flooder keeps a share of receives (US 9632852), a receive goes
on through the subqueues (US 8769134), a redelivery keeps a key's age (US 9529626), and
a queue's metadata and state (US 8769134). Nothing here asserts a timing: each step
polls what the runtime shows, with a deadline."""

import time
from collections import Counter

import pytest
from click.testing import CliRunner

import rayq
from rayq.cli import main
from rayq.config import Config, ConsumerConfig, FloodConfig, StoreConfig
from tests.integration.conftest import start_runtime, wait_until
from tests.integration.flooding import send

FLOOD = FloodConfig(window_s=1.0, windows=30, interval_s=0.5, depth_threshold=300,
                    enqueue_threshold=500, type_depth_threshold=1_000_000, sweep_batch=100,
                    healthy_depth=5_000, exit_dedicated=50, exit_shared=500)


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    config = Config(store=StoreConfig(shards=1), consumers=ConsumerConfig(count=0), flood=FLOOD)
    client, _ = start_runtime(tmp_path_factory, config, name="queue-rules")
    yield client
    rayq.shutdown()


def test_an_isolated_flooder_keeps_a_share_of_receives_while_others_wait(client):
    queue = client.create_queue("flooded", max_receives=None)
    send(queue, "a", 1_000)
    wait_until(lambda: any(f.tenant == "a" for f in client.flooders()), 120, what="a flagged")
    # stats() routes afresh: from here receives know a's dedicated subqueue
    wait_until(lambda: len(queue.stats().subqueues) == 2, what="a's dedicated subqueue")
    send(queue, "b", 100)
    tenants: Counter[str] = Counter()
    for _ in range(10):  # 50 deliveries: b's 100 never run out
        got = queue.receive(max_messages=5, visibility_timeout_s=600)
        tenants.update(m.tenant for m in got)
        queue.delete_batch([m.receipt for m in got])
    assert tenants["a"] > 0 and tenants["b"] > 0, tenants  # slowed, not stopped
    assert any(f.tenant == "a" for f in client.flooders())  # still isolated throughout


def test_a_receive_goes_on_through_the_subqueues_until_it_has_enough(client):
    key = client.create_account("second")
    queue = client.create_queue("second/split", subqueues=2, max_receives=None)
    send(queue, "second", 4)  # two producers: one subqueue each
    send(rayq.connect(account="second", key=key).queue("split"), "second", 4)
    wait_until(lambda: sorted(s["count"] for s in queue.stats().subqueues) == [4, 4],
               what="4 messages in each subqueue")
    assert len(queue.receive(max_messages=10, visibility_timeout_s=600)) == 8


def test_a_redelivered_message_keeps_its_age_from_when_it_was_sent(client):
    queue = client.create_queue("retried")
    queue.send("x", tenant="t", type="slow")
    sent_by = time.time()
    time.sleep(2)  # the message waits before its first delivery
    assert queue.receive(visibility_timeout_s=1)
    wait_until(lambda: queue.peek(), what="the message to be visible again")
    at_least = time.time() - sent_by
    [key] = queue.stats().keys.values()
    assert key.oldest_age_s >= at_least - 0.05, (key, at_least)  # not reset by the redelivery


def test_a_queues_metadata_state_and_approximate_count(client):
    key = client.create_account("owner")
    owner_queue = rayq.connect(account="owner", key=key).create_queue("held")
    owner_queue.set_metadata({"team": "billing", "comment": "monthly runs"})
    owner_queue.send_batch([rayq.Outgoing(i) for i in range(3)])  # routes cached from here
    admin_view = client.queue("owner/held")
    meta = wait_until(lambda: (m := admin_view.metadata()).approximate_count == 3 and m,
                      what="the approximate count")
    assert meta.metadata == {"team": "billing", "comment": "monthly runs"} and meta.enabled

    admin_view.disable()
    with pytest.raises(rayq.QueueDisabled):
        owner_queue.send("refused")  # its cached route said enabled: the shard refuses
    assert not owner_queue.metadata().enabled
    got = owner_queue.receive(max_messages=10)  # receives and deletes go on
    owner_queue.delete_batch([m.receipt for m in got])
    assert len(got) == 3
    owner_queue.clear()
    with pytest.raises(rayq.QueueDisabled):
        owner_queue.send("refused after a clear too")
    status = CliRunner().invoke(main, ["status"], terminal_width=200)
    assert status.exit_code == 0, status.output
    assert "owner/held" in status.output and "disabled" in status.output
    assert "team=billing" in status.output

    admin_view.enable()
    owner_queue.send("welcome again")
    assert [m.body for m in owner_queue.receive(wait_s=5)] == ["welcome again"]
    with pytest.raises(rayq.InvalidMessage):
        owner_queue.set_metadata({"bad name": "x"})


def test_a_queue_scales_out_past_the_number_of_shards_losing_nothing(ray_session,
                                                                    tmp_path_factory):
    scaling = rayq.ScalingConfig(interval_s=0.2, scale_up_ops_per_s=10, idle_s=3600,
                                 max_subqueues=3)
    # at the shard bound (max_shards): added subqueues share the shard there is
    client, _ = start_runtime(tmp_path_factory, Config(store=StoreConfig(shards=1, max_shards=1),
                                                       consumers=ConsumerConfig(count=0),
                                                       scaling=scaling), name="one-shard")
    queue = client.create_queue("wide", max_receives=None)
    sent: list[str] = []

    def grown():
        producer = rayq.connect().queue("wide")  # new transports spread over the subqueues
        for _ in range(10):  # requests make a subqueue busy, whatever their batches
            sent.extend(producer.send_batch([rayq.Outgoing(i) for i in range(30)]))
        live = [s for s in queue.stats().subqueues if s["state"] == "all"]
        return len(live) == 3 and live

    live = wait_until(grown, 120, interval_s=0, what="three subqueues on one shard")
    assert {s["shard"] for s in live} == {0}
    received = set()
    while got := queue.receive(max_messages=1000, visibility_timeout_s=600):
        received.update(m.id for m in got)
    assert received == set(sent)
