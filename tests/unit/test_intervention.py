"""Passive intervention and intervention per node: a passive decision is recorded and
changes no consumer's order; a consumer on a node where intervention is off ignores the
plan; the settings change at run time, are checked and survive reopening."""

import random

import pytest

from rayq.analytics.eventlog import decision_outcome
from rayq.config import Config, FairnessConfig
from rayq.core.consumers.decisions import PlanFollower
from rayq.core.fairness.intervention import (InterventionSettings, InterventionSwitch, changed,
                                             configured)
from rayq.core.fairness.policy import Decision, ListenPlan, decision_event
from rayq.core.kit.kv import LmdbKV
from rayq.errors import ConfigError, InvalidMessage


def intervening(permits=()):
    return Decision(at=5.0, intervening=True, latency_victims=frozenset({"b"}),
                    usage_victims=frozenset({"b"}), offenders=frozenset({"a"}),
                    fair_users=frozenset(), zero_latency=(), starvation={"a": -0.9, "b": 0.9},
                    expected_s={}, actual_s={}, permits=dict(permits), ignored_permits={})


def follower(settings, index=0, nodes=("node-1", "10.0.0.1")):
    f = PlanFollower(index, random.Random(0))
    f.nodes = frozenset(nodes)
    f.adopt(ListenPlan(1, intervening({"b": 2}), ("a", "b"), frozenset(), regular_consumers=2,
                       intervention=settings))
    return f


@pytest.mark.parametrize("settings, index, ordered", [
    (InterventionSettings(), 0, ["b", "a"]),                                  # active: most starved first
    (InterventionSettings(), 2, ["b", "a"]),                                  # a booster: permits first
    (InterventionSettings("passive"), 0, None),                               # passive: shard's dispatch
    (InterventionSettings("passive"), 2, None),                               # ... boosters too
    (InterventionSettings(off_nodes=frozenset({"node-1"})), 0, None),         # off here, by node id
    (InterventionSettings(off_nodes=frozenset({"10.0.0.1"})), 2, None),       # ... or by address
    (InterventionSettings(off_nodes=frozenset({"node-2"})), 0, ["b", "a"]),   # off elsewhere only
])
def test_a_consumer_follows_an_intervention_only_when_active_on_its_node(settings, index, ordered):
    f = follower(settings, index)
    assert f.order(exclude=set()) == ordered
    assert f.ordered == (1 if ordered else 0)


@pytest.mark.parametrize("mode, node, enabled, mode_after, off_after", [
    ("passive", None, None, "passive", {"n0"}),
    ("active", None, None, "active", {"n0"}),
    (None, "n1", False, "active", {"n0", "n1"}),
    (None, "n0", True, "active", set()),
    (None, "n9", True, "active", {"n0"}),            # on where it was on: unchanged
])
def test_an_admin_sets_the_mode_or_one_node_on_or_off(mode, node, enabled, mode_after, off_after):
    before = InterventionSettings("active", frozenset({"n0"}))
    after = changed(before, mode, node, enabled, by="ops", now=7.0)
    assert (after.mode, after.off_nodes, after.changed_by, after.changed_at) == \
        (mode_after, off_after, "ops", 7.0)


@pytest.mark.parametrize("mode, node, enabled, by", [
    ("loud", None, None, "ops"),          # no such mode
    ("passive", "n1", False, "ops"),      # both at once
    (None, "n1", None, "ops"),            # a node without on or off
    (None, None, True, "ops"),            # on or off without a node
    (None, "", False, "ops"),             # an empty node name
    (None, "n" * 201, False, "ops"),      # too long
    (None, 3, False, "ops"),              # not a name
    (None, "n1", 1, "ops"),               # enabled must be a bool
    (None, None, None, "ops"),            # nothing to change
    ("passive", None, None, ""),          # nobody
])
def test_bad_intervention_changes_are_refused(tmp_path, mode, node, enabled, by):
    switch = InterventionSwitch(LmdbKV(tmp_path / "c"), FairnessConfig())
    with pytest.raises(InvalidMessage):
        switch.change(mode, node, enabled, by, now=1.0)
    assert switch.settings == InterventionSettings()


def test_settings_start_as_configured_and_a_change_survives_reopening(tmp_path):
    config = FairnessConfig(intervention="passive", intervention_off_nodes=("n1",))
    switch = InterventionSwitch(LmdbKV(tmp_path / "c"), config)
    assert switch.settings == configured(config) == InterventionSettings("passive", frozenset({"n1"}))
    switch.change("active", None, None, "ops", now=3.0)
    switch.change(None, "n2", False, "ana", now=4.0)
    switch.kv.close()
    again = InterventionSwitch(LmdbKV(tmp_path / "c"), config)
    assert again.settings == InterventionSettings("active", frozenset({"n1", "n2"}), "ana", 4.0)


def test_a_passive_decision_is_recorded_with_what_it_would_start():
    event = decision_event(intervening({"b": 2}), ["b", "a"], passive=True, boosters=1)
    assert (event["intervening"], event["passive"], event["boosters"], event["listen_order"]) == \
        (True, True, 1, ["b", "a"])
    assert decision_event(intervening(), ["a"])["passive"] is False
    assert decision_outcome(event) == "passive"  # the event log's outcome column
    assert decision_outcome(decision_event(intervening(), ["a"])) == "intervening"


@pytest.mark.parametrize("fields", [{"intervention": "quiet"},
                                    {"intervention_off_nodes": "n1"},
                                    {"intervention_off_nodes": ("n1", "")}])
def test_bad_intervention_settings_are_refused_at_start(fields):
    with pytest.raises(ConfigError):
        Config(fairness=FairnessConfig(**fields))
