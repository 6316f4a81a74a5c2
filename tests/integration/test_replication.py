"""Replication before the acknowledgement, and failover, on a simulated cluster of three
data nodes (ray.cluster_utils.Cluster, in a process of its own:
tests/integration/scripts/replication.py). The scenarios that start on three data nodes
run one after another on one cluster; ``grow``, which starts on two, on another."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ON_THREE_NODES = ("copies", "restart", "pause", "node_kill")  # node_kill removes one: last


def scenarios(*modes: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``modes`` in one process; their results by mode, and the process."""
    script = os.path.join(ROOT, "tests", "integration", "scripts", "replication.py")
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, script, *modes], cwd=ROOT, capture_output=True,
                          text=True, timeout=600 * len(modes), env=env)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line["mode"]: line["result"] for line in lines}, done


@pytest.fixture(scope="module")
def three_nodes():
    return scenarios(*ON_THREE_NODES)


def scenario(mode: str, run: tuple[dict, subprocess.CompletedProcess] | None = None) -> dict:
    """``mode``'s result from ``run`` (the three-node scenarios' process), or from a
    process of its own; fails the test unless every scenario of the process passed."""
    results, done = run or scenarios(mode)
    assert done.returncode == 0 and mode in results, done.stderr[-3000:]
    return results[mode]


def test_each_shard_has_a_leader_and_an_in_sync_follower_on_another_node(three_nodes):
    result = scenario("copies", three_nodes)
    assert result["lost"] == 0 and result["acked"] == 200
    for shard, (replicas, in_sync, epoch) in result["places"].items():
        assert len(set(replicas)) == 2 and in_sync == replicas and epoch == 1
        for node in replicas:  # each copy in its own node's folder
            assert f"shard-{shard}" in result["folders"][node]
        assert result["roles"][shard] == [replicas[0], "leader"]
    assert sum(result["applied"].values()) >= 1  # the followers applied the leaders' writes


def test_every_acknowledged_message_survives_a_data_node_killed_with_its_folder(three_nodes):
    result = scenario("node_kill", three_nodes)
    assert result["lost"] == 0, result
    assert result["acked"] > result["acked_before"] + 300  # senders went on after the loss
    assert 1 in result["targets"]  # senders wrote to the shard whose leader was on n2
    assert result["places"]["1"][2] > 1 and result["places"]["1"][0][0] != "n2"
    for replicas, in_sync, _ in result["places"].values():
        # n2's copies replaced by followers seeded on the other nodes, in sync again
        assert "n2" not in in_sync and len(in_sync) == 2
    assert result["recovered_s"] is not None   # every sender acknowledged again


def test_a_paused_leader_is_replaced_and_its_later_writes_are_refused(three_nodes):
    result = scenario("pause", three_nodes)
    assert result["new_leader"] != result["old_leader"]
    assert result["epochs"][1] > result["epochs"][0]
    # refused by the followers' newer epoch, or the old leader was stopped for good
    assert result["old_write"] in ("refused: StaleEpoch", "refused: ActorDiedError"), result
    assert result["lost"] == 0 and result["acked"] == 401


def test_a_data_node_that_joins_gets_followers_then_leads_shards_and_takes_subqueues():
    result = scenario("grow")
    assert all("n3" not in in_sync for in_sync in result["before"].values())
    for shard, (in_sync, epoch) in result["after"].items():
        assert "n3" in in_sync and epoch > 1
        assert len(set(result["rows"][shard].values())) == 1, result["rows"]  # same rows
    assert "n3" in result["leaders"].values()  # leadership moved to the new node
    assert "n3" in result["spread"]  # and a new queue's subqueues land there too
    assert result["lost"] == 0


def test_a_restarted_runtime_keeps_its_places_and_its_followers_in_sync(three_nodes):
    result = scenario("restart", three_nodes)
    assert result["after"] == result["before"]  # no follower fell out of sync
    assert result["lost"] == 0 and result["acked"] == 400
