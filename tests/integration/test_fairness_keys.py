"""The fairness keys "tenant" and "tenant_type" end to end: the client keys each message,
the shards keep and report depths under that key, the coordinator plans and suspends
by it. No consumers run, so every task stays pending where the coordinator sees it."""

import pytest

import rayq
from rayq.config import Config, ConsumerConfig, FairnessConfig
from tests.integration.conftest import start_runtime, wait_until

MESSAGES = [("acme", "report"), ("acme", "mail"), ("globex", "report"), ("globex", "report")]
KEYS = {"tenant": {"acme", "globex"},
        "tenant_type": {"acme/report", "acme/mail", "globex/report"}}


@rayq.task(type="report")
def report():
    return "report"


@rayq.task(type="mail")
def mail():
    return "mail"


@pytest.fixture(scope="module", params=sorted(KEYS))
def keyed(request, ray_session, tmp_path_factory):
    config = Config(consumers=ConsumerConfig(count=0),
                    fairness=FairnessConfig(key=request.param, window_s=1.0, interval_s=0.2))
    client, _ = start_runtime(tmp_path_factory, config, name=f"keys-{request.param}")
    yield request.param, client
    rayq.shutdown()


def test_queue_depths_are_kept_per_configured_fairness_key(keyed):
    mode, client = keyed
    queue = client.create_queue("keyed")
    queue.send_batch([rayq.Outgoing(i, tenant=t, type=k) for i, (t, k) in enumerate(MESSAGES)])
    keys = queue.stats().keys
    assert set(keys) == KEYS[mode]
    if mode == "tenant":
        assert (keys["acme"].depth, keys["globex"].depth) == (2, 2)
    else:
        assert (keys["acme/report"].depth, keys["acme/mail"].depth,
                keys["globex/report"].depth) == (1, 1, 2)


def test_the_coordinator_plans_and_suspends_by_the_configured_key(keyed):
    mode, client = keyed
    handlers = {"report": report, "mail": mail}
    for tenant, type_ in MESSAGES:
        client.submit(handlers[type_], tenant=tenant)
    wait_until(lambda: set(client.fairness().listen_order) == KEYS[mode],
               what=f"the coordinator to list the pending {mode} keys")
    held = "acme" if mode == "tenant" else "acme/mail"
    client.suspend(held, reason="keyed test", by="tests")
    wait_until(lambda: set(client.fairness().listen_order) == KEYS[mode] - {held},
               what=f"{held!r} to leave the listen order")
    client.resume(held, by="tests")
    assert set(client.fairness().listen_order) == KEYS[mode]
