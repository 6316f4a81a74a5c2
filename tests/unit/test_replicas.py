"""Epochs, the in-sync set and failover decisions, on tables of cases."""

import pytest

from rayq.core.control.placement import ShardPlace
from rayq.core.control.replicas import (acked_through, check_epoch, check_in_sync, decode_places,
                                        drop_replica, encode_places, fresh_count, leader_lost,
                                        promote, rejoin, role_of, shrink)
from rayq.core.storage.layout import read_replica_state, replica_state
from rayq.errors import NotEnoughReplicas, ReplicaBehind, StaleEpoch

THREE = ShardPlace(0, ("a", "b", "c"), ("a", "b", "c"), 4)


@pytest.mark.parametrize("held, offered, refused", [
    (3, 2, True), (3, 3, False), (3, 4, False), (0, 1, False),
])
def test_a_replica_refuses_only_an_older_epoch(held, offered, refused):
    if refused:
        with pytest.raises(StaleEpoch):
            check_epoch(held, offered)
    else:
        check_epoch(held, offered)


@pytest.mark.parametrize("applied, first, count, fresh", [
    (0, 1, 3, 3),    # the first write sets
    (5, 6, 2, 2),    # the next ones
    (5, 4, 3, 1),    # a resend overlapping what was applied: only 7 is new
    (5, 2, 3, 0),    # a resend of applied ones only
])
def test_a_follower_applies_each_write_set_once(applied, first, count, fresh):
    assert fresh_count(applied, first, count) == fresh


def test_a_follower_offered_write_sets_past_a_gap_is_behind():
    with pytest.raises(ReplicaBehind):
        fresh_count(5, 7, 1)


@pytest.mark.parametrize("acked, followers, committed, through", [
    ({"b": 7, "c": 9}, ("b", "c"), 10, 7),
    ({"b": 7, "c": 9}, ("c",), 10, 9),
    ({}, ("b",), 10, 0),
    ({"b": 3}, (), 10, 10),   # no follower in sync: the leader's own commit acks
])
def test_writes_are_acknowledged_up_to_what_every_in_sync_follower_applied(
        acked, followers, committed, through):
    assert acked_through(acked, followers, committed) == through


def test_losing_a_follower_shrinks_the_in_sync_set_under_a_new_epoch():
    after = shrink(THREE, "b", 4)
    assert after.in_sync == ("a", "c") and after.replicas == THREE.replicas
    assert after.epoch == 5 and after.under_replicated


def test_shrinking_twice_changes_nothing_the_second_time():
    once = shrink(THREE, "b", 4)
    assert shrink(once, "b", 5) == once


def test_a_replaced_leader_cannot_shrink_the_in_sync_set():
    with pytest.raises(StaleEpoch):
        shrink(THREE, "b", 3)


@pytest.mark.parametrize("in_sync, min_in_sync, enough", [
    (("a", "b"), 1, True), (("a", "b"), 2, True), (("a",), 2, False), (("a",), 1, True),
])
def test_writes_need_min_in_sync_copies(in_sync, min_in_sync, enough):
    place = ShardPlace(0, ("a", "b"), in_sync, 1)
    if enough:
        check_in_sync(place, min_in_sync)
    else:
        with pytest.raises(NotEnoughReplicas):
            check_in_sync(place, min_in_sync)


@pytest.mark.parametrize("place, alive, expected", [
    # the first alive in-sync follower leads; the old leader is no replica any more
    (THREE, {"b", "c"}, ShardPlace(0, ("b", "c"), ("b", "c"), 5)),
    (THREE, {"c"}, ShardPlace(0, ("c",), ("c",), 5)),
    # an out-of-sync follower is never promoted, but stays a replica
    (ShardPlace(0, ("a", "b", "c"), ("a", "c"), 4), {"b", "c"},
     ShardPlace(0, ("c", "b"), ("c",), 5)),
    # no in-sync follower alive: the shard waits for its leader
    (ShardPlace(0, ("a", "b"), ("a",), 4), {"b"}, None),
    (THREE, set(), None),
])
def test_losing_the_leader_promotes_an_in_sync_follower(place, alive, expected):
    assert promote(place, alive) == expected


@pytest.mark.parametrize("alive, failed, lost", [
    ({"a", "b"}, 0, False), ({"b"}, 0, True), ({"a", "b"}, 3, True), ({"a", "b"}, 2, False),
])
def test_a_leader_is_lost_when_its_node_goes_or_it_stops_answering(alive, failed, lost):
    assert leader_lost(THREE, alive, failed, 3) is lost


def test_a_seeded_follower_rejoins_under_a_new_epoch_and_a_gone_one_is_dropped():
    shrunk = shrink(THREE, "c", 4)
    assert rejoin(shrunk, "c") == ShardPlace(0, ("a", "b", "c"), ("a", "b", "c"), 6)
    assert rejoin(shrunk, "d").replicas == ("a", "b", "c", "d")
    assert drop_replica(shrunk, "c") == ShardPlace(0, ("a", "b"), ("a", "b"), 6)
    assert drop_replica(THREE, "b") == THREE  # in sync: shrink first


@pytest.mark.parametrize("place, node, role", [
    (THREE, "a", "leader"), (THREE, "b", "follower"),
    (shrink(THREE, "b", 4), "a", "leader (under-replicated)"),
    (shrink(THREE, "b", 4), "b", "out-of-sync"), (None, "", "leader"),
])
def test_statistics_name_each_replicas_role(place, node, role):
    assert role_of(place, node) == role


def test_places_and_replica_states_read_back_as_written():
    places = {0: THREE, 1: ShardPlace(1, ("b",), ("b",), 1)}
    assert decode_places(encode_places(places)) == places
    assert decode_places(None) == {}
    assert read_replica_state(replica_state(7, 123)) == (7, 123)
    assert read_replica_state(None) == (0, 0)
