"""The report on a cluster of three data nodes (ray.cluster_utils.Cluster, in its own
process so the test run's Ray is untouched): every node's events are counted, each
node's files are read on that node alone, a drained node's events outlive it, and an
events URI shared by every writer is read instead of the nodes' folders."""

import pytest

from tests.integration.conftest import ScriptRun, run_script

SCRIPT_RUNS = (ScriptRun("event_nodes.py", timeout_s=2400, takes_s=250),)


@pytest.fixture(scope="module")
def phases():
    lines, done = run_script(*SCRIPT_RUNS)
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return {line["phase"]: line for line in lines}


def test_every_nodes_events_are_counted_each_read_on_its_own_node(phases):
    first = phases["first"]
    assert sorted(set(first["shards"].values())) == ["n1", "n2", "n3"]
    # the enqueues landed on all three nodes' folders, and the report counted them all
    assert all(n > 0 for n in first["enqueues_by_node"].values()), first["enqueues_by_node"]
    assert sum(first["enqueues_by_node"].values()) == first["sent"] == 300
    assert first["summary"] == {"events": first["truth"], "tenants": 30}
    assert sorted(source for source, *_ in first["reads"]) == ["n1", "n2", "n3"]
    assert all(on_its_node for _, on_its_node, _, _ in first["reads"]), first["reads"]
    assert sum(events for *_, events in first["reads"]) == first["truth"]
    assert first["page_here"]  # written by the caller, from the bytes the actor sent


def test_a_drained_nodes_events_still_count_after_it_left_with_its_folder(phases):
    drain = phases["drain"]
    assert drain["left"]["events"] == {"files": 0} and drain["shipped"] and drain["n3_files"]
    # while n3 still holds its files beside their copies, each is counted once
    assert drain["between"]["events"] == drain["truth_between"]
    assert drain["n3_gone"]
    assert drain["enqueues_after"] == drain["sent"] == 510  # n3's among them
    assert drain["after"]["events"] == drain["truth_after"] >= drain["truth_between"]
    assert drain["after"]["tenants"] == 30
    assert {source for source, *_ in drain["reads_after"]} <= {"n1", "n2"}
    assert all(on_its_node for _, on_its_node, _, _ in drain["reads_after"])


def test_with_an_events_uri_every_writer_shares_it_and_the_report_reads_it(phases):
    shared = phases["shared"]
    assert shared["enqueues"] == shared["sent"] == 192
    assert shared["summary"] == {"events": shared["truth"], "tenants": 30}
    assert shared["node_folders_empty"] and len(shared["reads"]) == 1
