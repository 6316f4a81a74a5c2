"""Data nodes and shard placement (rayq.core.control.placement), as tables of cases."""

import pytest

from rayq.core.control.placement import (DATA_CLAIM, DATA_NODE_LABEL, DataNode, data_claim,
                                         data_nodes_of, default_replicas, least_loaded_shard,
                                         node_folder, plan_shards, shard_indexes, spread)
from rayq.core.replication.shard_places import LOCAL_NODE, ShardPlace, new_follower_node
from rayq.errors import RuntimeFailure


def _node(node_id, name=None, alive=True, data=1.0, address="10.0.0.1"):
    labels = {DATA_NODE_LABEL: name} if name else {}
    return {"NodeID": node_id, "Alive": alive, "Labels": labels,
            "Resources": {"CPU": 1.0, **({"rayq_data": data} if data else {})},
            "NodeManagerAddress": address}


def test_data_nodes_are_the_alive_nodes_with_the_resource_sorted_by_label():
    nodes = [_node("c", "n3"), _node("a", "n1"), _node("dead", "n0", alive=False),
             _node("head", None, data=0), _node("b", "n2")]
    assert data_nodes_of(nodes, "rayq_data") == [DataNode("n1", "a"), DataNode("n2", "b"),
                                                 DataNode("n3", "c")]


def test_a_data_node_without_a_label_is_named_by_its_address():
    assert data_nodes_of([_node("a", address="10.1.2.3")], "rayq_data") == [
        DataNode("10.1.2.3", "a")]


def test_no_resource_configured_means_no_data_nodes():
    assert data_nodes_of([_node("a", "n1")], None) == []


def test_two_alive_data_nodes_with_one_name_are_refused():
    with pytest.raises(RuntimeFailure, match="share"):
        data_nodes_of([_node("a", "n1"), _node("b", "n1")], "rayq_data")


@pytest.mark.parametrize("node, resource, expected", [
    (DataNode("n1", "a"), "rayq_data", {"rayq_data": DATA_CLAIM}),  # a named data node
    (DataNode("10.1.2.3", "a"), "rayq_data", {"rayq_data": DATA_CLAIM}),  # named by address
    (DataNode("n1", "a"), "disks", {"disks": DATA_CLAIM}),      # the configured resource
    (DataNode(LOCAL_NODE, "a"), "rayq_data", {}),  # embedded: the node holds no resource
    (DataNode(LOCAL_NODE, "a"), None, {}),         # no data resource configured
])
def test_an_actor_holding_a_copy_claims_a_sliver_of_its_data_node(node, resource, expected):
    assert data_claim(node, resource) == expected


def test_the_claim_counts_for_ray_and_leaves_room_for_a_thousand_copies_a_node():
    assert 1e-4 <= DATA_CLAIM and 1000 * DATA_CLAIM <= 1


def test_every_data_node_found_holds_the_resource_it_is_asked_for():
    nodes = [_node("a", "n1"), _node("b", address="10.1.2.3"), _node("head", None, data=0)]
    for node in data_nodes_of(nodes, "rayq_data"):
        claim = data_claim(node, "rayq_data")["rayq_data"]
        held = next(n["Resources"]["rayq_data"] for n in nodes if n["NodeID"] == node.node_id)
        assert 0 < claim <= held


@pytest.mark.parametrize("node, expected", [
    (LOCAL_NODE, "/d"),  # the embedded runtime: files where they always were
    ("n1", "/d/n1"),
])
def test_each_node_keeps_its_files_in_its_own_folder(node, expected):
    assert node_folder("/d", node) == expected


@pytest.mark.parametrize("nodes, expected", [(1, 1), (2, 2), (5, 2)])
def test_two_copies_by_default_once_two_data_nodes_exist(nodes, expected):
    assert default_replicas(nodes) == expected


def test_spread_puts_leaders_round_the_nodes_and_followers_on_the_next():
    places = spread(range(4), ["n2", "n1", "n3"], replicas=2)
    assert [p.replicas for p in places.values()] == [("n1", "n2"), ("n2", "n3"),
                                                     ("n3", "n1"), ("n1", "n2")]
    assert all(p.in_sync == p.replicas and p.epoch == 1 for p in places.values())


def test_spread_never_puts_two_copies_on_one_node():
    [place] = spread([0], ["n1"], replicas=3).values()
    assert place.replicas == ("n1",)


def test_spread_starts_new_shards_on_the_nodes_leading_fewest():
    places = spread([5, 6], ["n1", "n2", "n3"], replicas=1, leaders={"n1": 2, "n2": 1})
    assert [p.leader for p in places.values()] == ["n3", "n2"]


def test_a_shard_starts_again_on_the_node_whose_disk_holds_its_files():
    on_disk = {"n1": [1], "n2": [0]}
    assert plan_shards([DataNode("n1", "a"), DataNode("n2", "b")], on_disk, 2) == {0: "n2", 1: "n1"}


def test_new_shards_go_to_the_nodes_leading_fewest_of_the_found_ones():
    nodes = [DataNode("n1", "a"), DataNode("n2", "b"), DataNode("n3", "c")]
    assert plan_shards(nodes, {"n1": [0, 1]}, 4) == {0: "n1", 1: "n1", 2: "n2", 3: "n3"}


def test_shard_folders_are_read_from_a_node_folder_listing():
    assert shard_indexes(["shard-2", "manager", "shard-10", "shard-x", "events"]) == [2, 10]


@pytest.mark.parametrize("depths, avoid, leaders, expected", [
    ({0: 5, 1: 9}, (), None, 0),                      # the least loaded
    ({0: 5, 1: 9}, (0,), None, 1),                    # a shard the queue does not use
    ({0: 1, 1: 2, 2: 9}, (0,), {0: "a", 1: "a", 2: "b"}, 2),  # another node first
    ({0: 1, 1: 2}, (0, 1), None, 0),                  # all used: the least loaded
    ({0: 1, 1: 2}, (0, 1, 0), None, 1),               # then round again, not the emptiest
])
def test_an_added_subqueue_lands_on_another_server(depths, avoid, leaders, expected):
    assert least_loaded_shard(depths, avoid, leaders) == expected


def test_a_queue_growing_past_the_shard_count_spreads_its_subqueues_evenly():
    depths, used = {0: 10, 1: 5_000}, []
    for _ in range(8):
        used.append(least_loaded_shard(depths, used, {0: "n1", 1: "n2"}))
    assert sorted(used) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_new_follower_goes_to_a_node_without_a_copy_the_least_followed_first():
    place = ShardPlace(0, ("n1", "n2"), ("n1",))
    assert new_follower_node(place, ["n1", "n2", "n3", "n4"], {"n3": 2}) == "n4"
    assert new_follower_node(place, ["n1", "n2"], {}) is None


def test_a_shard_is_under_replicated_while_a_copy_is_out_of_sync():
    assert ShardPlace(0, ("n1", "n2"), ("n1",)).under_replicated
    assert not ShardPlace(0, ("n1", "n2"), ("n1", "n2")).under_replicated


def test_a_starting_runtime_runs_every_shard_a_disk_holds_beyond_the_configured_ones():
    from rayq.core.control.placement import shard_count
    assert shard_count({}, 2) == 2
    assert shard_count({"n1": [0, 1], "n2": [1]}, 2) == 2
    assert shard_count({"n1": [0, 1, 2], "n2": [3]}, 2) == 4  # added by scaling
    assert shard_count({"": [0]}, 3) == 3


def test_an_added_shard_is_led_from_the_node_leading_fewest_its_followers_round_the_ring():
    from rayq.core.control.placement import new_shard_place
    from rayq.core.replication.shard_places import ShardPlace
    places = {0: ShardPlace(0, ("n1", "n2"), ("n1", "n2")),
              1: ShardPlace(1, ("n2", "n3"), ("n2", "n3"))}
    assert new_shard_place(2, places, ["n1", "n2", "n3"], 2) == \
        ShardPlace(2, ("n3", "n1"), ("n3", "n1"))
    assert new_shard_place(1, {0: ShardPlace(0, ("",), ("",))}, [""], 2) == \
        ShardPlace(1, ("",), ("",))
