"""Shards spread over data nodes and keep their files in their node's folder
(ray.cluster_utils.Cluster, in its own process so the test run's Ray is untouched)."""

from rayq.core.control.placement import DATA_CLAIM
from tests.integration.conftest import ScriptRun, run_script

SCRIPT_RUNS = (ScriptRun("data_nodes.py", takes_s=30),)


def test_shards_spread_over_the_data_nodes_each_in_its_own_folder_and_claim_their_node():
    lines, done = run_script(*SCRIPT_RUNS)
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = lines[-1]
    assert sorted(set(result["shards"].values())) == ["n1", "n2"]
    for shard, node in result["shards"].items():
        assert f"shard-{shard}" in result["folders"][node]
        # two data nodes: two copies by default, the follower's in the other node's folder
        assert sum(f"shard-{shard}" in names for names in result["folders"].values()) == 2
    assert "manager" in result["folders"]["n1"]  # control actors on the first node by name
    # every leader and follower holds a sliver of its node's data resource: in use, not idle
    copies = sum(f"shard-{shard}" in names for shard in result["shards"]
                 for names in result["folders"].values())
    assert result["claimed"] >= copies * DATA_CLAIM - 1e-9
    assert result["acked_received"] and result["acked"] == 100
