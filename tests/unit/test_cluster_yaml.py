"""cluster.yaml stays a valid `ray up` file: a head that holds no data, three data nodes
each of its own node type with its own name and disk, two copies of each store,
autoscaled workers for consumers, token auth on every node."""

import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA_RESOURCE, DATA_LABEL = "rayq_data", "rayq-data-node"


def config() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def data_types(cfg: dict) -> dict[str, dict]:
    return {name: t for name, t in cfg["available_node_types"].items()
            if t.get("resources", {}).get(DATA_RESOURCE)}


def starts(cfg: dict) -> str:
    return " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"])


def test_the_head_offers_no_cpu_and_holds_no_data():
    cfg = config()
    assert cfg["head_node_type"] == "head"
    assert cfg["available_node_types"]["head"]["resources"] == {"CPU": 0}
    assert "--num-cpus=0" in " ".join(cfg["head_start_ray_commands"])
    assert DATA_RESOURCE not in " ".join(cfg["head_start_ray_commands"][:2])


def test_three_data_nodes_each_its_own_node_type_of_one_node():
    cfg = config()
    data = data_types(cfg)
    assert len(data) == 3 and cfg["head_node_type"] not in data
    for node_type in data.values():
        assert node_type["min_workers"] == node_type["max_workers"] == 1
        assert node_type["resources"][DATA_RESOURCE] == 1
        assert node_type["resources"]["CPU"] == 0  # consumers never run beside the data


def test_each_data_node_has_its_own_stable_name():
    names = [t["labels"][DATA_LABEL] for t in data_types(config()).values()]
    assert len(set(names)) == 3 and all(names)


def test_each_data_node_keeps_its_data_on_a_disk_of_its_own():
    cfg = config()
    for node_type in data_types(cfg).values():
        [disk] = node_type["node_config"]["BlockDeviceMappings"]
        assert disk["Ebs"]["VolumeSize"] >= 100
    # three distinct objects: one disk each, not one mapping shared through an alias
    configs = [t["node_config"] for t in data_types(cfg).values()]
    assert len({id(c) for c in configs}) == 3
    # the data directory is each node's own, never a folder mounted from elsewhere
    assert not any("rayq-data" in target for target in cfg.get("file_mounts", {}))
    assert cfg["provider"]["cache_stopped_nodes"] is True  # a replaced node keeps its disk


def test_the_runtime_keeps_two_copies_and_starts_once_the_three_data_nodes_joined():
    cfg = config()
    start = " ".join(cfg["head_start_ray_commands"])
    assert "data_resource='rayq_data', replicas=2" in start
    assert start.index(">= 3") < start.index("rayq.start(")
    assert start.rstrip().endswith("&")  # in the background: the autoscaler starts them after


def test_autoscaled_workers_run_consumers_without_the_data_resource():
    cfg = config()
    worker = cfg["available_node_types"]["worker"]
    assert worker["min_workers"] >= 1 and DATA_RESOURCE not in worker["resources"]
    types = cfg["available_node_types"].values()
    assert sum(t.get("max_workers", 0) for t in types) <= cfg["max_workers"]


def test_every_node_starts_ray_with_token_auth():
    assert starts(config()).count("RAY_AUTH_MODE=token") == 2  # head and workers alike
