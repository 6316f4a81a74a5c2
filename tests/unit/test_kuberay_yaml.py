"""kuberay.yaml stays a RayCluster the runtime can live on: a head that runs no tasks,
three data pods each with its own name, volume and data resource, two copies of each
store, an autoscaled worker group, token auth."""

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


def ray_resources(group: dict) -> dict:
    """A group's Ray resources: KubeRay's top-level ``resources`` field, else
    rayStartParams.resources (a JSON object inside double quotes)."""
    if "resources" in group:
        return {name: float(value) for name, value in group["resources"].items()}
    params = group.get("rayStartParams", {})
    return json.loads(params.get("resources", '"{}"').strip('"').replace('\\"', '"'))


def groups(cluster: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}


def data_groups(cluster: dict) -> list[dict]:
    return [g for g in groups(cluster).values() if DATA_RESOURCE in ray_resources(g)]


def containers(spec: dict) -> list[dict]:
    return spec["template"]["spec"]["containers"]


def start_command(cluster: dict) -> str:
    head = cluster["spec"]["headGroupSpec"]
    return " ".join(containers(head)[0]["lifecycle"]["postStart"]["exec"]["command"])


def claims(group: dict) -> list[str]:
    return [v["persistentVolumeClaim"]["claimName"]
            for v in group["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v]


def test_the_head_offers_no_cpu_holds_no_data_and_starts_the_runtime_pinned_to_the_data():
    cluster, _ = manifest()
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert DATA_RESOURCE not in ray_resources(head)
    assert f"data_resource='{DATA_RESOURCE}'" in start_command(cluster)
    assert "rayq.start(" in start_command(cluster)


def test_the_runtime_keeps_two_copies_of_each_store():
    cluster, _ = manifest()
    assert "replicas=2" in start_command(cluster).replace(" ", "")


def test_three_data_pods_each_a_group_of_one_that_is_never_autoscaled():
    cluster, _ = manifest()
    data = data_groups(cluster)
    assert len(data) == 3
    for group in data:
        assert group["minReplicas"] == group["maxReplicas"] == group["replicas"] == 1
        assert group.get("numOfHosts", 1) == 1
        assert ray_resources(group)[DATA_RESOURCE] > 0


def test_each_data_pod_has_its_own_stable_name_in_the_ray_node_label():
    cluster, _ = manifest()
    data = data_groups(cluster)
    # the group-level labels field (KubeRay 1.5+); KubeRay refuses rayStartParams.labels
    assert all("labels" not in g.get("rayStartParams", {}) for g in data)
    names = [g["labels"][DATA_LABEL] for g in data]
    assert len(set(names)) == 3 and all(names)


def test_each_data_pod_mounts_a_read_write_once_claim_of_its_own_where_the_runtime_writes():
    cluster, docs = manifest()
    data = data_groups(cluster)
    per_group = [claims(g) for g in data]
    assert all(len(c) == 1 for c in per_group)
    names = [c[0] for c in per_group]
    assert len(set(names)) == 3
    volumes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for name in names:
        assert volumes[name]["spec"]["accessModes"] == ["ReadWriteOnce"]
    for group in data:
        mount = containers(group)[0]["volumeMounts"][0]["mountPath"]
        assert f"data_dir='{mount}/" in start_command(cluster)  # the data lives on the volume


def test_no_two_data_pods_share_a_kubernetes_node():
    cluster, _ = manifest()
    for group in data_groups(cluster):
        [term] = (group["template"]["spec"]["affinity"]["podAntiAffinity"]
                  ["requiredDuringSchedulingIgnoredDuringExecution"])
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchExpressions"] == [
            {"key": DATA_LABEL, "operator": "Exists"}]  # the group labels are on its pods


def test_the_runtime_starts_once_the_three_data_nodes_joined_waiting_in_the_background():
    cluster, _ = manifest()
    command = start_command(cluster)
    assert command.index(">= 3") < command.index("rayq.start(")
    # the data pods join through the head's service, which waits for the hook to end
    assert command.startswith("/bin/sh -c (") and command.rstrip().endswith("&")


def test_an_autoscaled_worker_group_runs_consumers_without_the_data_resource():
    cluster, _ = manifest()
    assert cluster["spec"]["enableInTreeAutoscaling"] is True
    scaled = [g for g in groups(cluster).values() if g["maxReplicas"] > g["minReplicas"]]
    assert scaled and all(DATA_RESOURCE not in ray_resources(g) for g in scaled)


def test_every_ray_container_keeps_token_auth_on():
    cluster, _ = manifest()
    specs = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for spec in specs:
        env = {e["name"]: e for e in containers(spec)[0]["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
