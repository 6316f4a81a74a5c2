"""Two runtimes on one Ray cluster, each under its own name: neither sees the other's
queues, messages or actors, and stopping one leaves the other running."""

import os
import subprocess
import sys
import textwrap

import pytest
import ray

import rayq
from rayq.names import namespace
from tests.integration.conftest import start_runtime, with_consumers
from rayq.remote import actor_names


def other_runtime(script: str) -> str:
    """Run ``script`` in a driver of its own on this Ray; its output (it must print)."""
    env = {**os.environ, "PYTHONPATH": os.getcwd(),
           "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, with_consumers(rayq.Config(), 0),
                              name="names")
    yield client
    rayq.shutdown()


def test_a_named_runtime_beside_the_default_one_shares_nothing_with_it(client, tmp_path):
    mine = client.create_queue("orders")
    mine.send("for the default runtime")
    out = other_runtime(f"""
        import rayq
        config = rayq.Config(name="staging", consumers=rayq.ConsumerConfig(count=0))
        staging = rayq.start(data_dir={str(tmp_path / 'staging')!r}, config=config)
        orders = staging.create_queue("orders")
        orders.send("for staging")
        got = orders.receive(max_messages=10, wait_s=1)
        print("staging got", [m.body for m in got])
        print("staging queues", sorted(staging.list_queues()))
    """)
    assert "staging got ['for staging']" in out
    assert "'default/orders'" not in out and "for the default runtime" not in out
    [got] = mine.receive(max_messages=10, wait_s=1)
    assert got.body == "for the default runtime"
    assert namespace() == "rayq" and not any(n.startswith("rayq-staging") for n in actor_names())
    staging = [a for a in ray.util.list_named_actors(all_namespaces=True)
               if a["namespace"] == "rayq-staging"]
    assert {"rayq-manager", "rayq-shard-0"} <= {a["name"] for a in staging}


def test_stopping_a_named_runtime_leaves_the_default_one_running(client):
    out = other_runtime("""
        import rayq
        staging = rayq.connect(name="staging")
        print("staging answers", staging.whoami())
        rayq.shutdown()
        print("stopped")
    """)
    assert "staging answers default" in out and "stopped" in out
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == "rayq-staging"]
    assert client.whoami() == "default" and "rayq-manager" in actor_names()


def test_a_runtime_name_is_checked(client):
    with pytest.raises(rayq.ConfigError):
        rayq.Config(name="no spaces")
    with pytest.raises(rayq.ConfigError):
        rayq.connect(name="")
