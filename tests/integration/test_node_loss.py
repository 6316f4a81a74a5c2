"""A worker node is lost mid-workload (ray.cluster_utils.Cluster, in its own process so
the test run's Ray is untouched): the runtime recovers by itself and loses nothing."""

from tests.integration.conftest import ScriptRun, run_script

SCRIPT_RUNS = (ScriptRun("node_loss.py", takes_s=30),)


def test_losing_the_consumers_node_loses_no_message_and_no_task():
    lines, done = run_script(*SCRIPT_RUNS)
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = lines[-1]
    assert result["tasks_ok"] == result["tasks"] == 60
    assert result["acked_received"] and result["after"] == 27
