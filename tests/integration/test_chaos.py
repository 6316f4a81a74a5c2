"""Chaos: a multi-tenant workload runs while shard, consumer, coordinator and flood
detector actors are killed at random (real ray.kill, restarts allowed). A checker
then proves every acknowledged message was delivered at least once, every task's
ref resolved with its value, and the runtime recovered by itself."""

import random
import threading
import time

import pytest
import ray

import rayq
from rayq.names import COORDINATOR, FLOOD_DETECTOR, namespace, consumer_name, shard_name
from rayq.config import Config, ConsumerConfig, FairnessConfig, FloodConfig
from tests.integration.conftest import start_runtime

CONFIG = Config(consumers=ConsumerConfig(count=2, visibility_timeout_s=2.0, poll_wait_s=0.3,
                                         adjust_interval_s=0.2, retry_backoff_s=0.1),
                fairness=FairnessConfig(window_s=1.0, latency_threshold_s=1.0, interval_s=0.5),
                flood=FloodConfig(interval_s=0.5))
CHAOS_S = 8.0
VICTIMS = [shard_name(0), shard_name(1), consumer_name(0), consumer_name(1), COORDINATOR,
           FLOOD_DETECTOR]


@rayq.task(type="square")
def square(x):
    time.sleep(0.01)
    return x * x


@rayq.task(type="echo")
def echo(text):
    return text


def chaos(stop: threading.Event, killed: list, seed: int = 7) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        name = rng.choice(VICTIMS)
        try:
            ray.kill(ray.get_actor(name, namespace=namespace()), no_restart=False)
            killed.append(name)
        except ValueError:
            pass  # restarting right now
        stop.wait(rng.uniform(0.4, 1.0))


def recording(errors: list, fn, *args) -> threading.Thread:
    """A thread running ``fn(*args)`` that records what it raised in ``errors``."""
    def run():
        try:
            fn(*args)
        except BaseException as err:  # noqa: BLE001 - reported by the tests, not swallowed
            errors.append(f"{fn.__name__}{args}: {err!r}")
    return threading.Thread(target=run)


@pytest.fixture(scope="module")
def outcome(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="chaos")
    client.create_queue("chaos-plain", max_receives=None)
    acked, received, refs, killed, errors = set(), set(), [], [], []
    retried = {"ReceiptInvalid": 0, "Overloaded": 0}
    stop, done_sending = threading.Event(), threading.Event()
    t0 = time.time()

    def produce(tenant):
        q = rayq.connect().queue("chaos-plain")
        i = 0
        while time.time() - t0 < CHAOS_S:
            acked.update(q.send_batch([rayq.Outgoing(f"{tenant}-{i}-{k}", tenant=tenant, type="plain")
                                       for k in range(20)]))
            i += 1
            time.sleep(0.05)

    def submit(tenant):
        c = rayq.connect()
        i = 0
        while time.time() - t0 < CHAOS_S:
            refs.append((c.submit(square, i, tenant=tenant), i * i))
            refs.append((c.submit(echo, f"{tenant}:{i}", tenant=tenant), f"{tenant}:{i}"))
            i += 1
            time.sleep(0.05)

    def consume():
        q = rayq.connect().queue("chaos-plain")
        while not (done_sending.is_set() and acked <= received):
            try:
                got = q.receive(max_messages=100, visibility_timeout_s=5, wait_s=0.5)
                received.update(m.id for m in got)
                if got:
                    q.delete_batch([m.receipt for m in got])
            except (rayq.ReceiptInvalid, rayq.Overloaded) as err:
                # a delete whose reply was lost in a kill, or a restarting shard pushing
                # back: the message comes back, so try again; any other error fails the test
                retried[type(err).__name__] += 1
                time.sleep(0.1)

    workers = [recording(errors, produce, t) for t in ("acme", "globex")]
    workers += [recording(errors, submit, t) for t in ("acme", "initech")]
    receiver = recording(errors, consume)
    killer = recording(errors, chaos, stop, killed)
    for w in workers + [receiver, killer]:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    killer.join()
    done_sending.set()
    results = [(ray.get(ref, timeout=180), expected) for ref, expected in refs]
    receiver.join(timeout=120)
    running = [t.name for t in workers + [receiver, killer] if t.is_alive()]
    recovered = ray.get(client.submit(square, 12), timeout=60)
    alive = [ray.get(ray.get_actor(n, namespace=namespace()).ping.remote(), timeout=60) for n in VICTIMS]
    yield {"acked": acked, "received": received, "results": results, "killed": killed,
           "recovered": recovered, "alive": alive, "errors": errors, "running": running,
           "retried": retried}
    rayq.shutdown()


def test_actors_were_really_killed_during_the_run(outcome):
    assert len(outcome["killed"]) >= 5
    assert {n for n in outcome["killed"] if n.startswith("rayq-shard")}


def test_every_thread_finished_without_an_unexpected_error(outcome):
    assert outcome["errors"] == [] and outcome["running"] == []


def test_every_acknowledged_message_was_delivered_at_least_once(outcome):
    assert outcome["acked"] and outcome["acked"] <= outcome["received"]


def test_every_submitted_task_resolved_with_its_own_value(outcome):
    assert outcome["results"] and all(got == expected for got, expected in outcome["results"])


def test_the_runtime_recovered_by_itself(outcome):
    assert outcome["recovered"] == 144
    assert len(outcome["alive"]) == len(VICTIMS)
