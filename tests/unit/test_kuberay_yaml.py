"""kuberay.yaml stays a RayCluster the runtime can live on: a head that runs no tasks,
data nodes with the data resource and label, an autoscaled worker group, token auth."""

import json
import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA_RESOURCE, DATA_LABEL = "rayq_data", "rayq-data-node"


def manifest() -> tuple[dict, list[dict]]:
    docs = [d for d in yaml.safe_load_all((ROOT / "kuberay.yaml").read_text()) if d]
    clusters = [d for d in docs if d["kind"] == "RayCluster"]
    assert len(clusters) == 1 and clusters[0]["apiVersion"] == "ray.io/v1"
    return clusters[0], docs


def start_resources(params: dict) -> dict:
    """KubeRay's rayStartParams.resources: a JSON object inside double quotes."""
    return json.loads(params.get("resources", '"{}"').strip('"').replace('\\"', '"'))


def groups(cluster: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}


def containers(spec: dict) -> list[dict]:
    return spec["template"]["spec"]["containers"]


def test_the_head_offers_no_cpu_and_starts_the_runtime_pinned_to_the_data():
    cluster, _ = manifest()
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    start = " ".join(containers(head)[0]["lifecycle"]["postStart"]["exec"]["command"])
    assert f"data_resource='{DATA_RESOURCE}'" in start and "rayq.start(" in start


def test_data_nodes_carry_the_data_resource_label_and_volume_and_are_not_autoscaled():
    cluster, docs = manifest()
    data = [g for g in groups(cluster).values()
            if DATA_RESOURCE in start_resources(g["rayStartParams"])]
    assert len(data) == 1
    group = data[0]
    assert start_resources(group["rayStartParams"])[DATA_RESOURCE] > 0
    assert group["rayStartParams"]["labels"].split("=")[0] == DATA_LABEL
    assert group["template"]["spec"]["nodeSelector"] == {DATA_LABEL: "true"}
    assert group["minReplicas"] == group["maxReplicas"] == group["replicas"]
    claim = group["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim for d in docs)
    mount = containers(group)[0]["volumeMounts"][0]["mountPath"]
    start = " ".join(containers(cluster["spec"]["headGroupSpec"])[0]["lifecycle"]["postStart"]
                     ["exec"]["command"])
    assert f"data_dir='{mount}/" in start  # the runtime's data lives on the data volume


def test_an_autoscaled_worker_group_runs_consumers_without_the_data_resource():
    cluster, _ = manifest()
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    scaled = [g for g in groups(cluster).values() if g["maxReplicas"] > g["minReplicas"]]
    assert scaled and all(DATA_RESOURCE not in start_resources(g["rayStartParams"]) for g in scaled)


def test_every_ray_container_keeps_token_auth_on():
    cluster, _ = manifest()
    specs = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for spec in specs:
        env = {e["name"]: e for e in containers(spec)[0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
