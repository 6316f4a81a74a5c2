"""Epochs, the in-sync set and failover decisions, on tables of cases."""

import ast
import asyncio
import pathlib

import pytest

from rayq.core.replication.shard_places import ShardPlace
from rayq.core.replication.shard_places import (ShipLog, acked_through, check_in_sync,
                                                decode_places, drop_replica, encode_places,
                                                fail_over, leader_lost, leader_move, newest,
                                                promote, rejoin, role_of, shrink, seed_target,
                                                seeds_wanted, with_followers, watched, count_missed,
                                                lost_leaders, missing)
from rayq.core.kit.kv import LmdbKV, Rewrite, Write, pack_write_sets, unpack_write_sets
from rayq.core.replication.replica import Replica, check_epoch, fresh_count, open_copy
from rayq.core.storage.layout import read_replica_state, replica_state
from rayq.errors import NotEnoughReplicas, ReplicaBehind, StaleEpoch, StoreError

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


@pytest.mark.parametrize("place, applied, expected", [
    # the first reachable in-sync follower leads; the old leader is no replica any more
    (THREE, {"b": 9, "c": 9}, ShardPlace(0, ("b", "c"), ("b", "c"), 5)),
    (THREE, {"c": 9}, ShardPlace(0, ("c",), ("c",), 5)),
    # the one that applied most leads; one that applied less falls out of sync
    (THREE, {"b": 8, "c": 9}, ShardPlace(0, ("c", "b"), ("c",), 5)),
    # an out-of-sync follower is never promoted, but stays a replica
    (ShardPlace(0, ("a", "b", "c"), ("a", "c"), 4), {"b": 9, "c": 7},
     ShardPlace(0, ("c", "b"), ("c",), 5)),
    # no in-sync follower reachable: the shard waits for its leader
    (ShardPlace(0, ("a", "b"), ("a",), 4), {"b": 9}, None),
    (THREE, {}, None),
])
def test_losing_the_leader_promotes_the_in_sync_follower_that_applied_most(
        place, applied, expected):
    assert promote(place, applied) == expected


@pytest.mark.parametrize("alive, failed, lost", [
    ({"a", "b"}, 0, False), ({"b"}, 0, True), ({"a", "b"}, 3, True), ({"a", "b"}, 2, False),
])
def test_a_leader_is_lost_when_its_node_goes_or_it_stops_answering(alive, failed, lost):
    assert leader_lost(THREE, alive, failed, 3) is lost


def test_a_seeded_follower_rejoins_under_a_new_epoch_and_a_gone_one_is_dropped():
    shrunk = shrink(THREE, "c", 4)
    assert rejoin(shrunk, "c") == ShardPlace(0, ("a", "b", "c"), ("a", "b", "c"), 6)
    assert rejoin(shrunk, "d").replicas == ("a", "b", "c", "d")
    assert drop_replica(shrunk, "c") == ShardPlace(0, ("a", "b"), ("a", "b"), 5)
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


def test_followers_go_on_the_next_nodes_round_the_ring_never_two_on_one():
    places = with_followers({0: "a", 1: "c"}, ["a", "b", "c"], 2)
    assert places[0].replicas == ("a", "b") and places[1].replicas == ("c", "a")
    assert with_followers({0: "a"}, ["a"], 3)[0].replicas == ("a",)
    assert with_followers({0: "a"}, ["a", "b"], 1)[0].in_sync == ("a",)


def writes(n: int) -> tuple:
    return (Write("rows", b"k%d" % n, b"v%d" % n),)


def test_the_ship_log_releases_acknowledgements_once_every_in_sync_follower_applied():
    log = ShipLog(10, ["b", "c"])
    for n in (11, 12, 13):
        assert log.add(writes(n)) == n
        log.wait(n, f"ack{n}")
    assert log.batch("b", 100) == (11, [writes(11), writes(12), writes(13)])
    assert log.batch("b", 100) == (14, [])
    assert log.batch("c", 2) == (11, [writes(11), writes(12)])
    log.applied("b", 13)
    assert log.released() == []           # c applied nothing yet
    log.applied("c", 12)
    assert log.released() == ["ack11", "ack12"]
    log.remove("c")                         # c is out of sync: b alone counts
    assert log.released() == ["ack13"]


def test_the_ship_log_sends_again_what_a_failed_call_did_not_confirm():
    log = ShipLog(0, ["b"])
    log.add(writes(1))
    log.add(writes(2))
    log.batch("b", 10)
    log.applied("b", 1)
    log.resend("b")
    assert log.batch("b", 10) == (2, [writes(2)])


def test_a_leader_without_followers_acknowledges_at_its_own_commit():
    log = ShipLog(5, [])
    log.wait(log.add(writes(6)), "ack")
    assert log.released() == ["ack"] and log.all_waiting() == []


def test_a_replica_applies_write_sets_once_in_order_and_refuses_an_old_epoch(tmp_path):
    replica = Replica(LmdbKV(tmp_path / "f"))
    assert replica.apply(2, 1, [writes(1), writes(2)]) == 2
    assert replica.apply(2, 2, [writes(2), writes(3)]) == 3   # a resend of 2
    with pytest.raises(ReplicaBehind):
        replica.apply(2, 5, [writes(5)])
    assert replica.fence(3) == (3, 3)
    with pytest.raises(StaleEpoch):
        replica.apply(2, 4, [writes(4)])
    replica.kv.close()
    again = Replica(LmdbKV(tmp_path / "f"))   # both survive a restart
    assert (again.epoch, again.seq) == (3, 3)
    assert again.kv.read(lambda txn: txn.get("rows", b"k3")) == b"v3"
    assert again.kv.read(lambda txn: txn.get("rows", b"k4")) is None


def test_write_sets_packed_for_the_follower_apply_as_the_sets_themselves(tmp_path):
    sets = [(Write("rows", b"a", b"1"), Write("meta", b"m", b"x")),
            (Write("rows", b"a", None), Write("rows", b"b", bytes(300))),
            (Rewrite("rows", b"c", b"head", b"b", 300), Rewrite("rows", b"c", b"", b"c", 300))]
    unpacked = unpack_write_sets(pack_write_sets(sets))
    assert [[tuple(w) for w in one] for one in unpacked] == [[tuple(w) for w in one] for one in sets]
    packed, plain = Replica(LmdbKV(tmp_path / "p")), Replica(LmdbKV(tmp_path / "q"))
    assert packed.apply(1, 1, unpacked) == plain.apply(1, 1, sets) == 3
    assert packed.kv.read(lambda txn: txn.get("rows", b"c")) == b"head" + bytes(296)
    for table, key in (("rows", b"a"), ("rows", b"b"), ("rows", b"c"), ("meta", b"m")):
        assert packed.kv.read(lambda txn: txn.get(table, key)) \
            == plain.kv.read(lambda txn: txn.get(table, key))
    assert packed.kv.read(lambda txn: txn.get("rows", b"a")) is None


def test_the_newest_epoch_of_each_shards_place_wins():
    old, new = ShardPlace(0, ("a", "b"), ("a", "b"), 2), ShardPlace(0, ("b",), ("b",), 3)
    other = ShardPlace(1, ("c",), ("c",), 1)
    assert newest({0: old, 1: other}, {0: new}) == {0: new, 1: other}
    assert newest({0: new}, {0: old}) == {0: new}


@pytest.mark.parametrize("place, copies, counts, target", [
    (ShardPlace(0, ("a", "b"), ("a",), 2), 2, {}, "b"),          # reseed the out-of-sync node
    (ShardPlace(0, ("a",), ("a",), 2), 2, {"b": 3, "c": 1}, "c"),  # the least followed
    (ShardPlace(0, ("a", "b"), ("a", "b"), 2), 2, {}, None),      # enough copies
    (ShardPlace(0, ("a", "b"), ("a", "b"), 2), 3, {}, "c"),       # a node joined: 3 wanted
    (ShardPlace(0, ("a", "b", "c"), ("a", "b"), 2), 3, {}, "c"),
])
def test_an_under_replicated_shard_seeds_a_follower_on_a_node_without_a_copy(
        place, copies, counts, target):
    assert seed_target(place, ["a", "b", "c"], copies, counts) == target


def test_a_joining_follower_is_kept_in_the_log_but_not_waited_for_until_counted():
    log = ShipLog(0, ["b"])
    log.wait(log.add(writes(1)), "ack1")
    log.join("c")                       # c's copy is taken after write set 1
    log.copied("c", 1)
    log.wait(log.add(writes(2)), "ack2")
    log.applied("b", 2)
    assert log.released() == ["ack1", "ack2"]  # c is not waited for
    assert log.batch("c", 10) == (2, [writes(2)])  # but still gets write set 2
    assert not log.caught_up("c")
    log.applied("c", 2)
    assert log.caught_up("c")
    log.count("c")
    log.wait(log.add(writes(3)), "ack3")
    log.applied("b", 3)
    assert log.released() == []          # now c is waited for too
    log.batch("c", 10)
    log.applied("c", 3)
    assert log.released() == ["ack3"]


def test_seeding_skips_shards_already_seeding_or_without_a_leader_and_spreads_followers():
    places = {0: ShardPlace(0, ("a",), ("a",), 2), 1: ShardPlace(1, ("b",), ("b",), 2),
              2: ShardPlace(2, ("x",), ("x",), 2), 3: ShardPlace(3, ("a",), ("a",), 2)}
    assert seeds_wanted(places, ["a", "b", "c"], 2, busy={3}) == [(0, "b"), (1, "a")]
    assert seeds_wanted(places, ["a", "b", "c"], 1, busy=()) == []


def test_a_leader_is_watched_while_it_has_a_follower_and_lost_after_missed_pings():
    one = ShardPlace(1, ("b",), ("b",), 1)
    assert watched([THREE, one]) == [THREE]
    missed = count_missed({0: 2, 1: 5}, {0: False, 1: True})
    assert missed == {0: 3, 1: 0}
    assert lost_leaders([THREE], {"a", "b", "c"}, missed, 3) == [0]
    assert lost_leaders([THREE], {"a", "b", "c"}, {0: 2}, 3) == []
    assert lost_leaders([THREE], {"b", "c"}, {}, 3) == [0]
    # a miss short of lost asks for a check soon; none, or one already lost, does not
    assert missing({0: 1, 1: 0}, 3) and not missing({0: 0, 1: 3}, 3) and not missing({}, 3)


@pytest.mark.parametrize("store", [dict(replicas=0), dict(replicas=4), dict(replicas=True),
                                   dict(replicas=2.0), dict(min_in_sync=0), dict(min_in_sync="2")])
def test_copies_out_of_range_are_refused_as_configuration_errors(store):
    from rayq.config import Config, StoreConfig
    from rayq.errors import ConfigError

    with pytest.raises(ConfigError):
        Config(store=StoreConfig(**store))


def test_copies_default_to_the_data_nodes_up_to_two():
    from rayq.config import Config, StoreConfig

    assert Config().store.replicas is None and Config().store.min_in_sync == 1
    assert Config(store=StoreConfig(replicas=3, min_in_sync=2)).store.replicas == 3


def test_a_shard_keeps_one_copy_unplaced_on_the_embedded_node_or_when_asked():
    from rayq.core.replication.shard_places import one_copy, reusable

    assert one_copy(None, None) and one_copy(ShardPlace(0, ("",), ("",)), None)
    assert one_copy(THREE, 1) and not one_copy(THREE, None) and not one_copy(THREE, 2)
    assert reusable({0: THREE}, 1, {"a", "b", "c"})
    assert not reusable({0: THREE}, 2, {"a", "b", "c"})   # a shard not placed yet
    assert not reusable({0: THREE}, 1, {"a", "b"})        # an in-sync copy's node is gone


def _place(shard, replicas, in_sync=None, epoch=1):
    return ShardPlace(shard, tuple(replicas), tuple(in_sync or replicas), epoch)


@pytest.mark.parametrize("places, alive, busy, expected", [
    # n3 joined and holds in-sync followers: n1 and n2 lead 2 each, n3 none -> one moves
    ({0: _place(0, ("n1", "n2", "n3")), 1: _place(1, ("n2", "n3", "n1")),
      2: _place(2, ("n1", "n3", "n2")), 3: _place(3, ("n2", "n1", "n3"))},
     ["n1", "n2", "n3"], False, (1, "n3")),
    # balanced enough (2, 1, 1): nothing moves
    ({0: _place(0, ("n1", "n2")), 1: _place(1, ("n2", "n3")), 2: _place(2, ("n1", "n3")),
      3: _place(3, ("n3", "n1"))}, ["n1", "n2", "n3"], False, None),
    # a seeding under way, or a shard out of sync: wait
    ({0: _place(0, ("n1", "n3")), 1: _place(1, ("n1", "n3"))}, ["n1", "n3"], True, None),
    ({0: _place(0, ("n1", "n3"), ("n1",)), 1: _place(1, ("n1", "n3"))}, ["n1", "n3"], False,
     None),
    # the node leading fewest holds no in-sync follower of the busiest node's shards
    ({0: _place(0, ("n1", "n2")), 1: _place(1, ("n1", "n2")), 2: _place(2, ("n2", "n1"))},
     ["n1", "n2", "n3"], False, None),
])
def test_leadership_moves_one_shard_at_a_time_to_a_node_that_leads_too_few(places, alive, busy,
                                                                           expected):
    assert leader_move(places, alive, busy) == expected


def test_a_planned_move_promotes_the_preferred_follower_only_if_it_applied_as_much():
    place = _place(0, ("n1", "n2", "n3"))
    assert promote(place, {"n2": 9, "n3": 9}, prefer="n3").leader == "n3"
    assert promote(place, {"n2": 9, "n3": 8}, prefer="n3").leader == "n2"
    assert promote(place, {"n2": 9, "n3": 9}).leader == "n2"


def test_a_leader_just_started_misses_no_ping_until_it_answers_or_its_grace_ends():
    from rayq.core.replication.shard_places import pings_counted
    starting = {1: 100.0, 2: 100.0}
    counted, still = pings_counted({0: False, 1: False, 2: True}, starting, now=50.0)
    assert counted == {0: False, 1: True, 2: True} and still == {1: 100.0}  # 2 answered
    counted, still = pings_counted({1: False}, still, now=100.0)
    assert counted == {1: False} and still == {}                          # grace over


class FakeFailover:
    """Followers as Replicas over LMDB under tmp_path, each holding ``applied`` write
    sets of the old leader's epoch; the replacements asked for, in order."""

    def __init__(self, tmp_path, place: ShardPlace, applied: dict[str, int]):
        self.replicas = {n: Replica(LmdbKV(tmp_path / n)) for n in applied}
        for node, seq in applied.items():
            self.replicas[node].apply(place.epoch, 1, [writes(n) for n in range(1, seq + 1)])
        self.down: set[str] = set()
        self.replaced: list[tuple[ShardPlace, ShardPlace]] = []

    async def fence(self, shard, node, epoch):
        return None if node in self.down else self.replicas[node].fence(epoch)[1]

    async def replace(self, old, new):
        self.replaced.append((old, new))


def test_failover_fences_the_followers_with_the_next_epoch_so_the_old_leader_is_refused(
        tmp_path):
    peers = FakeFailover(tmp_path, THREE, {"b": 3, "c": 2})
    new = asyncio.run(fail_over(THREE, {"b", "c"}, peers))
    assert new == ShardPlace(0, ("b", "c"), ("b",), THREE.epoch + 1)
    assert peers.replaced == [(THREE, new)]
    for node, replica in peers.replicas.items():
        assert replica.epoch == THREE.epoch + 1
        with pytest.raises(StaleEpoch):   # the paused old leader's next write set
            replica.apply(THREE.epoch, replica.seq + 1, [writes(9)])
    assert peers.replicas["b"].kv.read(lambda txn: txn.get("rows", b"k9")) is None


def test_failover_promotes_the_preferred_follower_only_if_it_applied_as_much(tmp_path):
    peers = FakeFailover(tmp_path, THREE, {"b": 3, "c": 3})
    assert asyncio.run(fail_over(THREE, {"b", "c"}, peers, prefer="c")).leader == "c"


@pytest.mark.parametrize("alive, down", [
    ({"b", "c"}, {"b", "c"}),   # both followers unreachable
    ({"a"}, set()),             # both followers' nodes gone
])
def test_failover_waits_when_no_in_sync_follower_is_reachable(tmp_path, alive, down):
    peers = FakeFailover(tmp_path, THREE, {"b": 3, "c": 3})
    peers.down = down
    assert asyncio.run(fail_over(THREE, alive, peers)) is None
    assert peers.replaced == []
    assert {r.epoch for r in peers.replicas.values()} == {THREE.epoch}  # nothing fenced


def test_failover_fences_only_followers_on_alive_nodes_and_promotes_among_them(tmp_path):
    peers = FakeFailover(tmp_path, THREE, {"b": 3, "c": 2})
    new = asyncio.run(fail_over(THREE, {"c"}, peers))
    assert new == ShardPlace(0, ("c",), ("c",), THREE.epoch + 1)
    assert peers.replicas["b"].epoch == THREE.epoch


def test_a_followers_copy_is_fsynced_on_every_commit(tmp_path):
    flags = open_copy(tmp_path / "f", 1 << 20).kv.env.flags()
    assert (flags["sync"], flags["metasync"]) == (True, True)


ROOT = pathlib.Path(__file__).resolve().parents[2]
# The actors that hold followers' copies: a shard's follower, a data node's control copies.
FOLLOWER_CLASSES = [("actors/replication/follower.py", "FollowerActor"), ("actors/control.py", "ControlFollower")]


def store_openings(path: str, name: str) -> list[ast.Call]:
    """The calls that open an LMDB store (``LmdbKV`` or ``open_copy``) in class ``name``."""
    tree = ast.parse((ROOT / path).read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    return [n for n in ast.walk(cls) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) in ("LmdbKV", "open_copy")]


@pytest.mark.parametrize("path, name", FOLLOWER_CLASSES)
def test_followers_never_open_their_copies_without_fsync(path, name):
    openings = store_openings(path, name)
    assert openings, f"{name} opens no store any more: point this test at where it does"
    assert [ast.unparse(call) for call in openings
            if any(k.arg == "durable" and not (isinstance(k.value, ast.Constant)
                                                and k.value.value is True)
                   for k in call.keywords)] == []


def test_a_ship_log_batch_stops_at_its_byte_bound_but_always_carries_one_set():
    log = ShipLog(0, ["b"])
    big = (Write("blobs", b"k", bytes(100)), Write("rows", b"gone", None))
    for _ in range(3):
        log.add(big)
    log.add(writes(4))
    assert log.batch("b", 100, max_bytes=50) == (1, [big])     # larger than the bound: alone
    assert log.batch("b", 100, max_bytes=201) == (2, [big, big])
    assert log.batch("b", 100, max_bytes=250) == (4, [writes(4)])


def test_a_packed_write_set_travels_in_parts_ray_passes_inline_and_joins_whole():
    from rayq.core.kit.kv import INLINE_PART_BYTES, inline_parts
    packed = pack_write_sets([(Write("rows", b"k%d" % i, bytes(300)),) for i in range(1000)])
    parts = inline_parts(packed)
    assert len(parts) > 1 and all(0 < len(p) <= INLINE_PART_BYTES < 100 * 1024 for p in parts)
    assert b"".join(parts) == packed
    assert inline_parts(b"") == [b""]


def test_a_moved_row_counts_whole_toward_a_calls_bytes_though_it_ships_only_its_head(tmp_path):
    from rayq.core.replication.shard_places import set_bytes
    moved = (Rewrite("rows", b"new", b"h" * 37, b"old", 60_000), Write("rows", b"gone", None),
             Write("meta", b"m", b"xy"))
    assert set_bytes(moved) == 60_002
    replica = Replica(LmdbKV(tmp_path / "r"))
    replica.apply(1, 1, [(Write("rows", b"old", bytes(59_000)),)])
    with pytest.raises(StoreError):  # a copy whose row is not the writer's: nothing applied
        replica.apply(1, 2, [moved])
    assert replica.seq == 1
    assert replica.kv.read(lambda txn: txn.get("rows", b"old")) == bytes(59_000)
