"""Short tasks are held in batches: a held task waiting for its turn stays hidden, and
one cancelled meanwhile never runs."""

import time

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime, wait_until
from tests.integration.probe import enter, leave, probe

# One consumer with one poller, running one task at a time; tasks hidden 1.5 s unless
# extended. A receive takes at least 3 tasks once handlers are short (prefetch).
CONFIG = Config(consumers=ConsumerConfig(count=1, min_load=1, max_load=1, prefetch=3,
                                         visibility_timeout_s=1.5, poll_wait_s=0.5,
                                         adjust_interval_s=0.2))
PROBE = "turns"


@rayq.task(type="nap")
def nap(seconds, key=None):
    if key is not None:
        enter("nap", key, PROBE)
        leave("nap", PROBE)
    time.sleep(seconds)
    return seconds


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="turns")
    probe(PROBE)
    yield client


def held_together(client, *calls: tuple) -> tuple[list, list[str]]:
    """Submit ``calls`` in one put, which one receive takes; (refs, task ids) once the
    consumer holds them all. The first runs, the others wait for their turn."""
    # Tiny tasks first: the consumers' recent handler time is short, so their receives
    # take batches of many tasks.
    assert ray.get(client.submit_many(nap, [(0,)] * 40)) == [0] * 40
    refs = client.submit_many(nap, list(calls))
    ids = [client.task_id(ref) for ref in refs]
    wait_until(lambda: all(client.task(i).state == "running" for i in ids),
               what="the consumer holding every task of the put")
    return refs, ids


def test_a_task_cancelled_while_it_waits_for_its_turn_never_runs(client):
    refs, ids = held_together(client, (6.0,), (0, "cancelled"), (0, "kept"))
    assert client.cancel(ids[1])
    assert ray.get(refs[2], timeout=60) == 0
    with pytest.raises(rayq.TaskCancelled):
        ray.get(refs[1], timeout=60)
    attempts = ray.get(probe(PROBE).report.remote())["attempts"]
    assert attempts.get("kept") == 1 and "cancelled" not in attempts


def test_tasks_held_behind_a_long_one_are_kept_hidden_and_run_once(client):
    # They wait for their turn far longer than the visibility timeout, while a second
    # consumer starts and polls: a task shown again meanwhile would run there too.
    refs, ids = held_together(client, (10.0,), (0,), (0,))
    client.scale_consumers(2)
    wait_until(lambda: len(client.consumer_stats()) == 2, timeout_s=60,
               what="the second consumer")
    if ray.wait(refs[:1], timeout=0)[0]:
        pytest.skip("the second consumer started only after the long task ended")
    assert ray.get(refs, timeout=60) == [10.0, 0, 0]
    assert [client.task(i).attempts for i in ids] == [1, 1, 1]
    stats = client.consumer_stats()
    assert len(stats) == 2 and all(s.lost == 0 for s in stats)
