"""Fair dispatch on real Ray with scaled-down windows: one type floods with long
handlers while two others trickle short ones; the same workload with fairness
off (plain FIFO) is the baseline. Figures are printed, not asserted as timings:
what is asserted is what the coordinator decided (victims, offenders, permits,
listen order) and that every task ran once. Which share each type gets is
measured by benchmarks/fairness.py, on like windows."""

import threading
import time

import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig, FairnessConfig
from rayq.names import COORDINATOR, namespace
from tests.integration.conftest import start_runtime, wait_until
from tests.integration.probe import probe, record_span

CONSUMERS = ConsumerConfig(count=2, max_load=2, visibility_timeout_s=5.0, poll_wait_s=0.3,
                           adjust_interval_s=0.1, defer_s=0.05)
# The coordinator on its own (docs/fairness-coordinator.md): the shards dispatch FIFO
# here, so the coordinator has skew to correct (tests/integration/test_fair_dispatch.py
# covers the shards' fair dispatch).
FAIRNESS = FairnessConfig(window_s=1.0, windows=6, latency_threshold_s=0.5, interval_s=0.25,
                          dispatch="fifo")
# 4 threads run 8 flood tasks a second; each trickle submits 5 a second, more than the
# third of the picks a shuffled listen list gives it, so it backs up and fairness has
# to intervene; FIFO leaves the trickles behind the whole flood. The trickles run
# TRICKLE_S, and with fairness on until a report shows the intervention (on a loaded
# machine that takes longer: the flood is kept backlogged meanwhile, up to DEADLINE_S).
FLOOD, FLOOD_S, TRICKLE_S, TRICKLE_EVERY_S, DEADLINE_S = 40, 0.5, 4.0, 0.2, 120.0


def _work(kind, seconds):
    started = time.time()
    time.sleep(seconds)
    record_span(kind, started, time.time(), name="fair")
    return kind


@rayq.task(type="flood")
def flood(seconds):
    return _work("flood", seconds)


@rayq.task(type="trickle-a")
def trickle_a(seconds):
    return _work("trickle-a", seconds)


@rayq.task(type="trickle-b")
def trickle_b(seconds):
    return _work("trickle-b", seconds)


def run_workload(client, until_intervening: bool, each=lambda: None, until=lambda: True) -> dict:
    """Flood first, then trickle for TRICKLE_S (and ``until_intervening``: until a report
    shows the intervention, the flood topped up meanwhile), calling ``each`` every round,
    and on until ``until()`` holds too (up to DEADLINE_S); returns waits, usage shares,
    refs and that report."""
    watcher = probe("fair")
    for fn in (flood, trickle_a, trickle_b):
        client.register(fn)
    # consumers know every handler once one task of each type has run
    ray.get([client.submit(fn, 0.0, tenant="warm-up") for fn in (flood, trickle_a, trickle_b)],
            timeout=60)
    t0 = time.time()
    refs = [client.submit(flood, FLOOD_S, tenant="big") for _ in range(FLOOD)]
    trickled = {"trickle-a": [], "trickle-b": []}
    stop = threading.Event()

    def trickle(fn, kind):
        c = rayq.connect()
        while not stop.is_set():
            trickled[kind].append(c.submit(fn, 0.01, tenant="small"))
            time.sleep(TRICKLE_EVERY_S)

    threads = [threading.Thread(target=trickle, args=a)
               for a in ((trickle_a, "trickle-a"), (trickle_b, "trickle-b"))]
    for t in threads:
        t.start()
    intervening = None
    while time.time() - t0 < (DEADLINE_S if until_intervening else TRICKLE_S):
        if intervening is None:
            report = client.fairness()
            intervening = report if report.intervening else None
        each()
        if time.time() - t0 >= TRICKLE_S and (intervening or not until_intervening) and until():
            break
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(pending) < FLOOD // 2:  # the flood stays backlogged while the trickles run
            refs += [client.submit(flood, FLOOD_S, tenant="big") for _ in range(FLOOD // 2)]
        time.sleep(FAIRNESS.interval_s / 2)
    stop.set()
    horizon = time.time()
    for t in threads:
        t.join()
    all_refs = refs + trickled["trickle-a"] + trickled["trickle-b"]
    results = ray.get(all_refs, timeout=300)
    usage = {}
    for kind, started, ended in ray.get(watcher.spans_of.remote()):
        usage[kind] = usage.get(kind, 0.0) + max(0.0, min(ended, horizon) - max(started, t0))
    total = sum(usage.values()) or 1.0
    waits = {r.type: r for r in client.task_stats(by="type")}
    ray.kill(watcher)
    return {"results": results, "expected": ["flood"] * len(refs) + ["trickle-a"] * len(trickled["trickle-a"])
            + ["trickle-b"] * len(trickled["trickle-b"]),
            "trickle_p99_s": max(waits[k].wait_p99_s for k in trickled),
            "trickle_share": sum(usage.get(k, 0.0) for k in trickled) / total,
            "intervening": intervening}


@pytest.fixture(scope="module")
def figures(ray_session, tmp_path_factory):
    out = {}
    for enabled in (False, True):
        config = Config(consumers=CONSUMERS,
                        fairness=FairnessConfig(**{**vars(FAIRNESS), "enabled": enabled}))
        client, _ = start_runtime(tmp_path_factory, config, name=f"fair-{enabled}")
        figures = run_workload(client, until_intervening=enabled)
        drained = time.time()
        deadline = drained + 60  # the coordinator's next evaluations see the queue drained
        while True:
            figures["report"] = client.fairness()
            seen = figures["report"].evaluated_at
            if not enabled or (seen and seen > drained + FAIRNESS.interval_s
                               and not figures["report"].intervening) or time.time() > deadline:
                break
            time.sleep(FAIRNESS.interval_s)
        out[enabled] = figures
    rayq.shutdown()
    print(f"\nfairness off (FIFO): trickle p99 wait {out[False]['trickle_p99_s']:.2f}s, "
          f"trickle usage share {out[False]['trickle_share']:.1%}; "
          f"on: {out[True]['trickle_p99_s']:.2f}s, {out[True]['trickle_share']:.1%}")
    return out


def test_every_task_of_both_runs_completes_once_with_its_own_result(figures):
    for run in figures.values():
        assert sorted(run["results"]) == sorted(run["expected"])


def test_the_report_shows_intervention_starting_and_then_stopping(figures):
    history = [e for e in figures[True]["report"].history if e["kind"] == "fairness"]
    states = [e["intervening"] for e in history]
    assert True in states, history
    started = states.index(True)
    assert False in states[started:]  # it stopped once the trickles caught up
    first = history[started]
    assert set(first["victims"]) & {"trickle-a", "trickle-b"}
    assert not figures[True]["report"].intervening


def test_with_fairness_off_the_coordinator_never_intervenes(figures):
    report = figures[False]["report"]
    assert not report.intervening and report.evaluated_at is None
    assert not [e for e in report.history if e["kind"] == "fairness"]


def test_an_intervening_report_names_starved_victims_and_serves_them_first(figures):
    report = figures[True]["intervening"]
    assert report is not None, "no report showed the intervention while the trickles ran"
    band = FAIRNESS.band
    assert report.victims and report.victims == report.latency_victims & report.usage_victims
    assert report.victims <= {"trickle-a", "trickle-b"} and "flood" not in report.victims
    assert all(report.starvation[k] > band for k in report.usage_victims)
    assert all(report.starvation[k] < -band for k in report.offenders)
    assert report.offenders <= {"flood"}
    assert not report.fair_users & (report.usage_victims | report.offenders)
    order = report.listen_order  # most starved first: every victim ahead of every offender
    assert max(order.index(k) for k in report.victims) < min(
        (order.index(k) for k in report.offenders), default=len(order))
    # permits go to keys waiting past the threshold; an offender's are set aside
    assert set(report.permits) | set(report.ignored_permits) <= report.latency_victims
    assert set(report.ignored_permits) <= report.offenders
    assert all(1 <= n <= 4 for n in [*report.permits.values(), *report.ignored_permits.values()])
    assert report.intervening_since is not None and report.intervening_since <= report.evaluated_at


def test_suspended_keys_are_not_dispatched_and_their_rule_history_stays(ray_session, tmp_path_factory):
    config = Config(consumers=CONSUMERS, fairness=FAIRNESS)
    client, _ = start_runtime(tmp_path_factory, config, name="suspend")
    probe("fair")
    rule = client.suspend("trickle-a", reason="maintenance", by="ops")
    assert rule.active and client.fairness().suspended[-1].reason == "maintenance"
    coordinator = ray.get_actor(COORDINATOR, namespace=namespace())
    before = ray.get(coordinator.plan.remote(None)).version  # may predate the suspension
    wait_until(lambda: all((s.plan_version or -1) > before for s in client.consumer_stats()),
               what="every consumer following a plan made after the suspension")
    held = client.submit(trickle_a, 0.0)
    assert ray.get(client.submit(trickle_b, 0.0), timeout=60) == "trickle-b"
    # every poll that started after `held` was queued would have taken it unless suspended;
    # at most max_load polls per consumer were already under way
    polls = sum(s.polls for s in client.consumer_stats())
    in_flight = CONSUMERS.count * CONSUMERS.max_load
    wait_until(lambda: sum(s.polls for s in client.consumer_stats()) > polls + 2 * in_flight,
               timeout_s=120, what="consumers polling on")  # slow on a crowded machine
    ready, _ = ray.wait([held], timeout=0)
    [queued] = client.queue("tasks").peek(5)
    assert not ready and queued.type == "trickle-a" and queued.dequeue_count == 0
    lifted = client.resume("trickle-a", by="ops")
    assert lifted.lifted_at is not None and lifted.reason == "maintenance"
    assert ray.get(held, timeout=60) == "trickle-a"
    assert [r.active for r in client.fairness().suspended] == [False]
    with pytest.raises(rayq.InvalidMessage):
        client.suspend("", reason="x", by="ops")
    rayq.shutdown()


def test_a_passive_intervention_only_records_and_a_node_can_have_intervention_off(
        ray_session, tmp_path_factory):
    config = Config(consumers=CONSUMERS,
                    fairness=FairnessConfig(**{**vars(FAIRNESS), "intervention": "passive"}))
    client, _ = start_runtime(tmp_path_factory, config, name="passive")
    consumers = set()
    run = run_workload(client, until_intervening=True,
                       each=lambda: consumers.add(len(client.consumer_stats())))
    assert sorted(run["results"]) == sorted(run["expected"])
    assert run["intervening"] is not None and run["intervening"].passive  # it would intervene
    decisions = [e for e in client.fairness().history if e["kind"] == "fairness"]
    assert any(e["intervening"] for e in decisions) and all(e["passive"] for e in decisions)
    assert consumers == {CONSUMERS.count}                                  # no booster started
    assert sum(s.plan_orders for s in client.consumer_stats()) == 0        # no order followed
    # active for the runtime, off on this node (the only one): consumers here ignore the plan
    here = ray.get_runtime_context().get_node_id()
    assert client.set_intervention(node=here, enabled=False, by="ops").off_nodes == {here}
    settings = client.set_intervention("active", by="ops")
    assert (settings.mode, settings.off_nodes, settings.changed_by) == ("active", {here}, "ops")
    run = run_workload(client, until_intervening=True)
    assert run["intervening"] is not None and not run["intervening"].passive
    assert sum(s.plan_orders for s in client.consumer_stats()) == 0
    # on again on this node: its consumers follow the plan while it intervenes (a
    # consumer learns of the plan after the report that shows it: the run goes on a while)
    client.set_intervention(node=here, enabled=True, by="ops")
    ordered = [0]
    run_workload(client, until_intervening=True,
                 each=lambda: ordered.append(sum(s.plan_orders for s in client.consumer_stats())),
                 until=lambda: ordered[-1] > 0)
    assert max(ordered) > 0
    assert client.fairness().intervention.off_nodes == frozenset()
    with pytest.raises(rayq.InvalidMessage):
        client.set_intervention("passive", node=here, enabled=False, by="ops")
    rayq.shutdown()
