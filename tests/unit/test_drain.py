"""Draining a data node, as decisions over tables: first every shard it holds a copy of
gets one more on a node that stays, then leaderships move and followers leave, one at a
time; the control stores likewise."""

import pytest

from rayq.core.control.control_places import (ControlPlace, control_left_on, drained, hands_over,
                                              leaving_copies, seed_target)
from rayq.core.replication.shard_places import ShardPlace
from rayq.core.replication.shard_places import drain_seeds, drain_step, drop_follower, left_on

NODES = ["n1", "n2", "n3"]


def places(*rows) -> dict[int, ShardPlace]:
    return {i: ShardPlace(i, tuple(nodes), tuple(nodes), 2) for i, nodes in enumerate(rows)}


def test_a_shard_with_a_copy_on_a_draining_node_gets_a_copy_on_a_node_that_stays_first():
    table = places(("n1", "n2"), ("n2", "n3"), ("n3", "n1"))
    assert sorted(drain_seeds(table, {"n1"}, NODES, 2, busy=())) == [(0, "n3"), (2, "n2")]
    assert drain_seeds(table, {"n1"}, NODES, 2, busy={0}) == [(2, "n2")]
    assert drain_step(table, {"n1"}, NODES, 2) is None  # nothing moves before those


def test_once_copies_stay_the_leadership_moves_then_the_draining_follower_leaves():
    table = places(("n1", "n2", "n3"), ("n2", "n3", "n1"))
    assert drain_step(table, {"n1"}, NODES, 2) == ("lead", 0, "n2")
    table[0] = ShardPlace(0, ("n2", "n3"), ("n2", "n3"), 3)  # after the planned move
    assert drain_step(table, {"n1"}, NODES, 2) == ("drop", 1, "n1")
    table[1] = drop_follower(table[1], "n1")
    # the same epoch: the leader, which learns of it later, is not refused meanwhile
    assert table[1] == ShardPlace(1, ("n2", "n3"), ("n2", "n3"), 2)
    assert drain_step(table, {"n1"}, NODES, 2) is None
    assert left_on(table, "n1") == {"leads": 0, "copies": 0}


def test_with_fewer_nodes_staying_than_copies_wanted_the_drain_keeps_what_it_can():
    table = places(("n1", "n2"))
    assert drain_seeds(table, {"n1"}, ["n1", "n2"], 2, busy=()) == []
    assert drain_step(table, {"n1"}, ["n1", "n2"], 2) == ("lead", 0, "n2")


def test_a_shard_with_no_copy_on_a_draining_node_is_left_alone():
    table = places(("n2", "n3"))
    assert drain_seeds(table, {"n1"}, NODES, 2, busy=()) == []
    assert drain_step(table, {"n1"}, NODES, 2) is None


@pytest.mark.parametrize("in_sync, draining, target, leaving", [
    (("n1", "n2"), {"n2"}, "n3", []),        # a copy on n3 first, n2 stays until then
    (("n1", "n2", "n3"), {"n2"}, None, ["n2"]),  # then n2's copy leaves
    (("n1", "n2"), set(), None, []),
])
def test_a_control_store_replaces_a_draining_copy_before_letting_it_go(
        in_sync, draining, target, leaving):
    place = ControlPlace("manager", in_sync, 4)
    assert seed_target(place, NODES, 2, {}, draining) == target
    assert leaving_copies(place, NODES, 2, draining) == leaving


def test_a_drain_is_done_when_the_node_holds_nothing():
    control = {"manager": ControlPlace("manager", ("n2", "n1")),
               "flood": ControlPlace("flood", ("n3", "n2"))}
    assert control_left_on(control, "n1") == {"leads": 0, "copies": 1}
    assert not drained({"shards": {"leads": 0, "copies": 0}, "control": {"copies": 1}})
    assert drained({"shards": {"leads": 0, "copies": 0}, "control": {"leads": 0}})


@pytest.mark.parametrize("in_sync, staying, hands", [
    (("n1", "n2"), {"n2", "n3"}, False),        # one copy stays: n3 is seeded first
    (("n1", "n2", "n3"), {"n2", "n3"}, True),    # two stay: the leadership moves
    (("n2", "n1"), {"n2", "n3"}, False),        # its leader stays: nothing to hand over
    (("n1", "n2"), {"n2"}, True),               # one node left: as many as can stay
])
def test_a_control_store_led_from_a_draining_node_hands_over_once_its_copies_stay(
        in_sync, staying, hands):
    assert hands_over(ControlPlace("manager", in_sync, 3), {"n1"}, staying, 2) is hands


def test_a_node_back_under_a_drained_nodes_name_is_a_new_node_not_draining():
    from rayq.core.control.placement import DataNode, still_draining

    marks = {"n1": "id-1"}
    assert still_draining(marks, [DataNode("n1", "id-1"), DataNode("n2", "id-2")]) == {"n1"}
    assert still_draining(marks, [DataNode("n1", "id-9"), DataNode("n2", "id-2")]) == set()


def test_a_drain_marks_the_alive_node_of_that_name_and_refuses_an_unknown_one():
    from rayq.core.control.placement import DataNode, marked_to_drain, unmarked
    from rayq.errors import InvalidMessage

    nodes = [DataNode("n1", "id-1"), DataNode("n2", "id-2")]
    marks = marked_to_drain({}, "n1", nodes)
    assert marks == {"n1": "id-1"} and unmarked(marks, "n1") == {}
    with pytest.raises(InvalidMessage):
        marked_to_drain(marks, "n9", nodes)
    with pytest.raises(InvalidMessage):
        unmarked(marks, "n2")
