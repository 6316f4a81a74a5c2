"""cluster.yaml stays a valid `ray up` file that keeps token auth on and the data pinned."""

import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_cluster_yaml_has_a_head_with_the_data_and_workers_for_consumers():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    nodes = config["available_node_types"]
    assert config["head_node_type"] == "head"
    assert nodes["head"]["resources"] == {"CPU": 0, "rayq_data": 2}
    assert nodes["worker"]["min_workers"] >= 1 and nodes["worker"]["max_workers"] <= config["max_workers"]
    starts = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert starts.count("RAY_AUTH_MODE=token") == 2  # head and workers alike
    assert "data_resource='rayq_data'" in starts
