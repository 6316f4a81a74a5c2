"""Flood rules of docs/flood-detection.md with scaled-down thresholds (depth 100, enqueues 50,
type depth 200, exits 5 dedicated / 50 shared, healthy depth 500)."""

import pytest

from rayq.config import FloodConfig
from rayq.core.flood.detection import Flooder, FloodView, detect, may_leave, shard_healthy

CONFIG = FloodConfig(depth_threshold=100, enqueue_threshold=50, type_depth_threshold=200,
                     healthy_depth=500, exit_dedicated=5, exit_shared=50)


def view(depth=None, dedicated=None, enqueued=None, spilled=None):
    return FloodView(depth or {}, dedicated or {}, enqueued or {}, spilled or {})


def test_a_deep_combination_whose_tenant_enqueued_a_lot_is_a_flooder():
    v = view(depth={("q", "report", "acme"): 150, ("q", "report", "meek"): 40},
             enqueued={("q", "report", "acme"): 60, ("q", "report", "meek"): 10})
    changes = detect(v, [], CONFIG, now=5.0)
    assert [(f.queue, f.type, f.tenant, f.since) for f in changes.added] == [("q", "report", "acme", 5.0)]


@pytest.mark.parametrize("depth, enqueued, flooding", [
    (101, 51, True), (100, 51, False), (101, 50, False), (10, 10_000, False)])
def test_both_thresholds_must_be_passed(depth, enqueued, flooding):
    v = view(depth={("q", "t", "a"): depth}, enqueued={("q", "t", "a"): enqueued})
    assert bool(detect(v, [], CONFIG, 0.0).added) == flooding


def test_a_tenant_flooding_several_types_is_listed_once_per_type():
    v = view(depth={("q", t, "acme"): 120 for t in ("report", "email", "export")},
             enqueued={("q", t, "acme"): 80 for t in ("report", "email", "export")})
    added = detect(v, [], CONFIG, 0.0).added
    assert sorted(f.type for f in added) == ["email", "export", "report"]
    assert {f.tenant for f in added} == {"acme"}


def test_a_deep_dedicated_queue_makes_the_whole_type_a_flooder():
    v = view(dedicated={("q", "report", "acme"): 150, ("q", "report", "beta"): 60})
    added = detect(v, [Flooder("q", "report", "acme", 0.0)], CONFIG, 1.0).added
    assert [(f.type, f.tenant, f.type_level) for f in added] == [("report", "*", True)]


def test_a_flood_that_ends_is_removed_once_a_sweep_emptied_spill_and_few_remain():
    flooder = Flooder("q", "report", "acme", since=0.0, swept_empty=True)
    still_spilled = view(depth={("q", "report", "acme"): 2}, spilled={("q", "report", "acme"): 1})
    not_swept = Flooder("q", "report", "acme", since=0.0)
    assert detect(still_spilled, [not_swept], CONFIG, 9.0).removed == ()
    backlog = view(dedicated={("q", "report", "acme"): 5})
    assert detect(backlog, [flooder], CONFIG, 9.0).removed == ()  # not below 5 yet
    drained = view(dedicated={("q", "report", "acme"): 4})
    changes = detect(drained, [flooder], CONFIG, 10.0)
    assert [f.tenant for f in changes.removed] == ["acme"] and not changes.kept


def test_a_type_level_flooder_leaves_under_the_shared_threshold():
    flooder = Flooder("q", "report", "*", since=0.0, swept_empty=True)
    assert not may_leave(flooder, view(depth={("q", "report", "a"): 30, ("q", "report", "b"): 30}),
                         CONFIG)
    assert may_leave(flooder, view(depth={("q", "report", "a"): 30, ("q", "report", "b"): 19}),
                     CONFIG)


def test_flooders_that_go_on_are_kept_with_fresh_figures():
    flooder = Flooder("q", "report", "acme", since=0.0)
    v = view(depth={("q", "report", "acme"): 180}, enqueued={("q", "report", "acme"): 100},
             spilled={("q", "report", "acme"): 40})
    changes = detect(v, [flooder], CONFIG, 3.0)
    assert not changes.added and not changes.removed
    [kept] = changes.kept
    assert (kept.since, kept.spilled, kept.depth) == (0.0, 40, 220)


@pytest.mark.parametrize("depth, pressure, healthy", [
    (0, False, True), (499, False, True), (500, False, False), (10, True, False)])
def test_the_sweeper_only_works_on_a_healthy_shard(depth, pressure, healthy):
    assert shard_healthy(depth, pressure, CONFIG) == healthy


def test_the_view_sums_shards_and_keeps_dedicated_spilled_and_dead_letter_apart():
    from rayq.core.flood.detection import build_view

    layout = {1: ("q", False), 2: ("q", True), 3: ("q", False)}  # 9 is a DLQ: not listed
    shard_a = {("L", 1, "t", "acme"): 10, ("L", 2, "t", "acme"): 5, ("S", 1, "t", "acme"): 7,
               ("L", 9, "t", "acme"): 100}
    shard_b = {("L", 3, "t", "acme"): 1}
    v = build_view(layout, [shard_a, shard_b], [{(1, "t", "acme"): [1.0, 2.0]},
                                                 {(3, "t", "acme"): [3.0], (9, "t", "acme"): [50.0]}])
    combo = ("q", "t", "acme")
    assert (v.depth[combo], v.dedicated_depth[combo], v.spilled[combo], v.enqueued[combo]) == \
        (11, 5, 7, 6.0)
    assert v.unprocessed(combo) == 23 and v.unprocessed(("q", "t", "*")) == 23


def test_a_shard_that_turns_unhealthy_mid_sweep_stops_the_sweeper_at_once():
    from rayq.core.flood.detection import sweep_step

    depth, spilled, batches, steps = 0, 1000, 0, []
    pressure_after = 4  # memory pressure arrives after the fourth batch
    while (step := sweep_step(depth, batches >= pressure_after, spilled, batches, CONFIG, 50)) \
            == "sweep":
        depth, spilled, batches = depth + 100, spilled - 100, batches + 1
        steps.append(step)
    assert (step, batches, spilled) == ("pause", 4, 600)
    # and by depth alone: healthy below 500, so five batches of 100 then a pause
    depth, batches = 0, 0
    while sweep_step(depth, False, 1000, batches, CONFIG, 50) == "sweep":
        depth, batches = depth + 100, batches + 1
    assert batches == 5 and sweep_step(depth, False, 1000, batches, CONFIG, 50) == "pause"


@pytest.mark.parametrize("spilled, batches, expected", [(0, 0, "done"), (10, 50, "later"),
                                                        (10, 3, "sweep")])
def test_the_sweeper_ends_when_nothing_is_spilled_and_yields_after_its_share(
        spilled, batches, expected):
    from rayq.core.flood.detection import sweep_step

    assert sweep_step(0, False, spilled, batches, CONFIG, 50) == expected


def test_two_accounts_queues_of_one_name_are_judged_apart():
    """The detector's layout names queues account-qualified (the manager's flood_layout):
    acme's deep orders make acme a flooder of acme/orders, not of globex's orders."""
    from rayq.core.flood.detection import build_view

    layout = {1: ("acme/orders", False), 2: ("globex/orders", False)}
    counts = {("L", 1, "t", "acme"): 80, ("L", 2, "t", "acme"): 80}
    enqueues = {(1, "t", "acme"): [60.0], (2, "t", "acme"): [60.0]}
    changes = detect(build_view(layout, [counts], [enqueues]), [], CONFIG, now=1.0)
    assert changes.added == ()  # 80 + 80 would pass 100 were the two one queue
    counts[("L", 1, "t", "acme")] = 120
    added = detect(build_view(layout, [counts], [enqueues]), [], CONFIG, now=2.0).added
    assert [(f.queue, f.tenant) for f in added] == [("acme/orders", "acme")]
