"""The embedded default as a new user meets it, in a fresh process: Ray's dashboard and
state API work, and nothing listens off loopback, Spark (RayDP) included. (That a cluster keeps Ray's own
binding is shown by test_autoscaler.py.)"""

import ipaddress

import pytest

from tests.integration.conftest import ScriptRun, run_script

SCRIPT_RUNS = (ScriptRun("embedded.py", ("--spark",), data_dir=True, takes_s=50),)


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


@pytest.fixture(scope="module")
def embedded() -> dict:
    """What the script printed: rayq.start() in a fresh process, with no Ray address
    inherited."""
    lines, done = run_script(*SCRIPT_RUNS)
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return lines[-1]


def test_the_state_api_lists_the_runtimes_actors(embedded):
    assert {"rayq-manager", "rayq-coordinator", "rayq-flood-detector", "rayq-shard-0",
            "rayq-consumer-0"} <= set(embedded["actors"])


def test_rayq_leaves_the_jobs_own_ray_alone(embedded):
    job = embedded["job"]
    # the job's namespace is its own (Ray's anonymous one), not rayq's
    assert job["namespace"] != "rayq" and job["namespace_after_shutdown"] == job["namespace"]
    assert job["log_to_driver"] is True  # its tasks' output still reaches it
    assert job["cache_after_shutdown"] == "cached"  # rayq.shutdown() stops rayq's actors only


def test_the_dashboard_runs_on_loopback(embedded):
    assert embedded["dashboard_url"].split(":")[0] == "127.0.0.1"
    assert any("dashboard.py" in p["name"] for p in embedded["processes"])


def test_no_process_of_the_runtime_or_its_spark_listens_off_loopback(embedded):
    assert embedded["node_ip"] == "127.0.0.1"
    assert any("java" in p["name"] and p["listen"] for p in embedded["processes"])  # Spark seen
    listening = [(p["name"][:60], ip) for p in embedded["processes"] for ip in p["listen"]]
    assert len({name for name, _ in listening}) >= 5  # GCS, raylet, agents, actors: all seen
    assert [(name, ip) for name, ip in listening if not is_loopback(ip)] == []
