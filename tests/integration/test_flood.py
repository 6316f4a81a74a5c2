"""A tenant floods a shared queue at 50x the others' rate, on real Ray with scaled-down
thresholds: it is detected, isolated, spilled, swept back and removed, and every
message sent is delivered. The same run with flood handling off is the baseline for
the other tenants' waits. Figures are printed (and shard memory), not asserted as timings."""

import threading
import time

import pytest

import rayq
from rayq.config import Config, ConsumerConfig, FloodConfig
from rayq.core.fairness.tallies import percentile
from tests.integration.conftest import start_runtime

FLOOD = FloodConfig(window_s=1.0, windows=10, interval_s=0.5, depth_threshold=200,
                    enqueue_threshold=200, type_depth_threshold=1_000_000, sweep_batch=100,
                    healthy_depth=1000, exit_dedicated=50, exit_shared=500)
SEND_S = 3.0
OTHERS = ("acme", "globex", "initech")


def scenario(client) -> dict:
    queue = client.create_queue("shared", max_receives=None)
    sent: dict[str, list[str]] = {t: [] for t in OTHERS + ("big",)}
    seen: dict[str, float] = {}
    waits: dict[str, list[float]] = {t: [] for t in OTHERS + ("big",)}
    memory: list[int] = []
    stop = threading.Event()
    t0 = time.time()

    def flood():
        q = rayq.connect().queue("shared")
        while time.time() - t0 < SEND_S:  # 100 every 50 ms: 2 000 a second
            sent["big"] += q.send_batch([rayq.Outgoing(i, tenant="big", type="job")
                                         for i in range(100)])
            time.sleep(0.05)

    def trickle(tenant):
        q = rayq.connect().queue("shared")
        while time.time() - t0 < SEND_S:  # 40 a second each: big sends 50 times as much
            sent[tenant].append(q.send(tenant, tenant=tenant, type="job"))
            time.sleep(0.025)

    def receive():
        q = rayq.connect().queue("shared")
        while not stop.is_set():
            got = q.receive(max_messages=50, visibility_timeout_s=30, wait_s=0.2)
            now = time.time()
            for m in got:
                if m.id not in seen:
                    waits[m.tenant].append(now - m.enqueued_at)
                seen[m.id] = now
            if got:
                q.delete_batch([m.receipt for m in got])
            time.sleep(0.05)  # a receiver slower than the flood: about 1 000 a second

    def watch_memory():
        shards = client.transport.shards
        while not stop.is_set():
            memory.append(max(call_process(s) for s in shards))
            time.sleep(0.25)

    workers = [threading.Thread(target=flood), threading.Thread(target=receive),
               threading.Thread(target=watch_memory)]
    workers += [threading.Thread(target=trickle, args=(t,)) for t in OTHERS]
    for w in workers:
        w.start()
    for w in workers[3:] + workers[:1]:
        w.join()
    all_sent = {mid for ids in sent.values() for mid in ids}
    deadline = time.time() + 90
    while not all_sent <= set(seen) or client.flooders():
        assert time.time() < deadline, (len(all_sent - set(seen)), client.flooders())
        time.sleep(0.2)
    stop.set()
    for w in workers[1:3]:
        w.join()
    return {"sent": all_sent, "seen": set(seen), "left": queue.count(),
            "others_p99_s": percentile(sorted(w for t in OTHERS for w in waits[t]), 99),
            "max_private_mib": max(memory) / 2**20, "events": client.flood_events(),
            "stats": client.stats()}


def call_process(shard):
    import ray

    return ray.get(shard.process.remote())["private_bytes"]


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory):
    out = {}
    for enabled in (False, True):
        config = Config(consumers=ConsumerConfig(count=0),
                        flood=FloodConfig(**{**vars(FLOOD), "enabled": enabled}))
        client, _ = start_runtime(tmp_path_factory, config, name=f"flood-{enabled}")
        out[enabled] = scenario(client)
    rayq.shutdown()
    on, off = out[True], out[False]
    print(f"\nother tenants' p99 wait: {on['others_p99_s']:.2f}s with isolation, "
          f"{off['others_p99_s']:.2f}s without; shard private memory max "
          f"{on['max_private_mib']:.0f} MiB with, {off['max_private_mib']:.0f} MiB without; "
          f"spilled {sum(s.store.spilled for s in on['stats'])}, "
          f"swept {sum(s.store.swept for s in on['stats'])}, "
          f"moved {sum(s.store.moved for s in on['stats'])}")
    return out


def test_every_message_sent_is_delivered_and_none_is_left_behind(runs):
    for run in runs.values():
        assert run["sent"] <= run["seen"]
        assert run["left"] == 0


def test_the_flooder_is_detected_spilled_swept_back_and_removed(runs):
    events = [e for e in runs[True]["events"] if e["tenant"] == "big"]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "detected" and "isolated" in kinds and "swept" in kinds
    assert kinds[-1] == "removed"
    assert not [e for e in runs[True]["events"] if e["tenant"] in OTHERS]
    stats = runs[True]["stats"]
    assert sum(s.store.spilled for s in stats) > 0
    assert sum(s.store.swept for s in stats) == sum(s.store.spilled for s in stats)


def test_without_flood_handling_nothing_is_detected_or_spilled(runs):
    assert runs[False]["events"] == ()
    assert sum(s.store.spilled for s in runs[False]["stats"]) == 0
