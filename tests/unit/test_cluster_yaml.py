"""cluster.yaml stays a valid `ray up` file that keeps token auth on and the data pinned."""

import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_cluster_yaml_has_data_nodes_for_two_copies_and_workers_for_consumers():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    nodes = config["available_node_types"]
    assert config["head_node_type"] == "head"
    assert nodes["head"]["resources"] == {"CPU": 0, "rayq_data": 1}
    # replicas=2: a leader and a follower on distinct data nodes, and one more to reseed on
    assert nodes["data"]["resources"]["rayq_data"] == 1 and nodes["data"]["min_workers"] >= 2
    assert nodes["worker"]["min_workers"] >= 1 and nodes["worker"]["max_workers"] <= config["max_workers"]
    starts = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert starts.count("RAY_AUTH_MODE=token") == 2  # head and workers alike
    assert "data_resource='rayq_data', replicas=2" in starts
