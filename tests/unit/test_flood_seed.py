"""The rules of docs/flood-detection.md with its source's thresholds (depth 100 000,
enqueues 10 000, type depth 200 000, exits 5 000 dedicated / 50 000 shared):
detection by the depth of a message type's queue, and a flooder that leaves once it
is back to normal."""

from dataclasses import replace

import pytest

from rayq.config import FloodConfig
from rayq.core.flood.detection import Flooder, FloodView, detect, may_leave, sweep_step, type_depths

DEFAULTS = FloodConfig()  # the source's own thresholds


def view(depth=None, dedicated=None, enqueued=None, spilled=None):
    return FloodView(depth or {}, dedicated or {}, enqueued or {}, spilled or {})


def flood(*tenants_and_counts, type_="report", others=()):
    """Each tenant enqueued ``n`` of ``type_`` in the look-back and all of it is queued."""
    rows = [(("q", type_, tenant), n) for tenant, n in tenants_and_counts]
    rows += [(("q", t, tenant), n) for t, tenant, n in others]
    return view(depth=dict(rows), enqueued=dict(rows))


@pytest.mark.parametrize("name, v, flagged", [
    ("five tenants x 30 000 (depth 150 000)",
     flood(*[(f"org{i}", 30_000) for i in range(5)]), {f"org{i}" for i in range(5)}),
    ("60 000 plus 50 000 (depth 110 000)", flood(("acme", 60_000), ("beta", 50_000)),
     {"acme", "beta"}),
    ("a light tenant of the flooding type is left alone",
     flood(("acme", 60_000), ("beta", 45_000), ("meek", 9_000)), {"acme", "beta"}),
    ("exactly at the enqueue threshold is not over it",
     flood(("acme", 95_000), ("edge", 10_000)), {"acme"}),
    ("a type's queue at exactly 100 000 is not flooding",
     flood(("acme", 60_000), ("beta", 40_000)), set()),
    ("another type's depth does not count", flood(("acme", 60_000), others=[
        ("email", "beta", 50_000)]), set()),
])
def test_a_type_queue_deeper_than_the_threshold_flags_every_heavy_tenant_of_it(name, v, flagged):
    added = detect(v, [], DEFAULTS, now=1.0).added
    assert {f.tenant for f in added} == flagged, name
    assert {f.type for f in added} <= {"report"}


def test_the_type_queue_counts_live_and_dedicated_subqueues_of_every_tenant():
    v = view(depth={("q", "report", "beta"): 50_000},
             dedicated={("q", "report", "acme"): 60_000},
             enqueued={("q", "report", "beta"): 50_000})
    assert type_depths(v) == {("q", "report"): 110_000}
    assert [f.tenant for f in detect(v, [], DEFAULTS, 0.0).added] == ["beta"]


def test_the_type_level_rule_still_works_on_top():
    v = view(dedicated={("q", "report", "acme"): 150_000, ("q", "report", "beta"): 60_000},
             enqueued={("q", "report", "acme"): 20_000, ("q", "report", "beta"): 20_000})
    known = [Flooder("q", "report", "acme", 0.0), Flooder("q", "report", "beta", 0.0)]
    added = detect(v, known, DEFAULTS, 1.0).added
    assert [(f.tenant, f.type_level) for f in added] == [("*", True)]



# "a certain message type may be flooding across many different tenants": the type's
# queue over the type depth threshold (200 000) flags the type, whatever its tenants sent.
@pytest.mark.parametrize("name, v, flagged", [
    ("50 tenants x 5 000 (depth 250 000), none heavy",
     flood(*[(f"org{i}", 5_000) for i in range(50)]), {("report", "*")}),
    ("40 tenants x 5 000 (depth 200 000) is not over it",
     flood(*[(f"org{i}", 5_000) for i in range(40)]), set()),
    ("live and dedicated subqueues both count",
     view(depth={("q", "report", "a"): 150_000}, dedicated={("q", "report", "b"): 60_000}),
     {("report", "*")}),
    ("one heavy tenant past both thresholds: the tenant and the type",
     flood(("acme", 210_000)), {("report", "acme"), ("report", "*")}),
    ("another type's depth does not count",
     flood(*[(f"org{i}", 5_000) for i in range(30)], others=[("email", "x", 100_000)]), set()),
])
def test_a_type_whose_queue_is_over_the_type_threshold_is_a_type_level_flooder(name, v, flagged):
    added = detect(v, [], DEFAULTS, now=1.0).added
    assert {(f.type, f.tenant) for f in added} == flagged, name

# -- leaving the list: "no messages left in the secondary store right after the last
# sweeper run", then depth + enqueues since that sweep under 5 000 / 50 000 ------------
ACME = ("q", "report", "acme")


@pytest.mark.parametrize("swept_empty, depth, spilled_since, leaves", [
    (True, 100, 30, True),        # back to a trickle: a few spilled since the sweep
    (True, 4_000, 999, True),     # 4 999 < 5 000
    (True, 4_000, 1_000, False),  # 5 000 is not under 5 000
    (False, 0, 0, False),         # the last sweep paused or ran out of batches
])
def test_a_tenant_flooder_leaves_when_its_last_sweep_emptied_spill_and_little_is_left(
        swept_empty, depth, spilled_since, leaves):
    flooder = Flooder(*ACME, since=0.0, swept_empty=swept_empty)
    v = view(dedicated={ACME: depth}, spilled={ACME: spilled_since},
             enqueued={ACME: 200_000})  # its look-back still shows the flood
    changes = detect(v, [flooder], DEFAULTS, 9.0)
    assert bool(changes.removed) is leaves
    assert may_leave(flooder, v, DEFAULTS) is leaves


def test_a_type_level_flooder_leaves_under_the_shared_threshold():
    flooder = Flooder("q", "report", "*", 0.0, swept_empty=True)
    v = view(depth={("q", "report", "a"): 30_000}, spilled={("q", "report", "b"): 19_999})
    assert may_leave(flooder, v, DEFAULTS)
    assert not may_leave(flooder, replace(v, spilled={("q", "report", "b"): 20_000}), DEFAULTS)


def test_a_flooder_still_flooding_stays_whatever_its_spill():
    flooder = Flooder(*ACME, since=0.0, swept_empty=True)
    v = view(depth={("q", "report", "beta"): 99_000}, dedicated={ACME: 2_000},
             enqueued={ACME: 50_000})
    assert not detect(v, [flooder], DEFAULTS, 9.0).removed  # type depth 101 000, acme heavy


@pytest.mark.parametrize("target_depth, pressure, step", [
    (49_999, False, "sweep"), (50_000, False, "pause"), (0, True, "pause")])
def test_the_sweeper_looks_at_the_queue_it_sweeps_into(target_depth, pressure, step):
    # the shard may hold millions for other queues: only the target's depth is passed
    assert sweep_step(target_depth, pressure, 500, 0, DEFAULTS, 10) == step
