"""A worker node is lost mid-workload (ray.cluster_utils.Cluster, in its own process so
the test run's Ray is untouched): the runtime recovers by itself and loses nothing."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_losing_the_consumers_node_loses_no_message_and_no_task():
    script = os.path.join(ROOT, "tests", "integration", "scripts", "node_loss.py")
    done = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1])
    assert result["tasks_ok"] == result["tasks"] == 60
    assert result["acked_received"] and result["after"] == 27
