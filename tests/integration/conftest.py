"""One local Ray per test run; runtimes are restarted per module when configs differ."""

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import boto3
import pytest
from botocore.config import Config as BotoConfig

import rayq
from rayq.config import with_consumers
from rayq.runtime.local import free_port

_names = itertools.count()
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/integration, so ``-m "not integration"`` deselects them.

    (A ``pytestmark`` in a conftest applies to nothing: only test modules read it.)
    A conftest hook sees the whole run's items, so filter by path.
    """
    for item in items:
        if _HERE in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.integration)
    # the modules whose script runs the lane makes go last, the longest run's first
    items.sort(key=lambda item: -max((run.takes_s for run in script_runs(item)), default=1e9))


def script_runs(item) -> tuple:
    return getattr(getattr(item, "module", None), "SCRIPT_RUNS", ())


@pytest.fixture(scope="session")
def ray_session():
    """A Ray of this test run's own, whatever else runs on the machine.

    ``ray.init()`` would attach to a cluster named by ``$RAY_ADDRESS`` or by the
    ``ray_current_cluster`` file a ``ray start`` / ``rayq start`` left in Ray's temp
    directory, where ``num_cpus`` is refused. So: ``address="local"`` (always start
    one), ``RAY_ADDRESS`` cleared and ``RAY_TMPDIR`` set to a private directory for the
    run (subprocesses that run ``rayq.start`` or ``rayq start`` look there too,
    and find no one else's cluster), on loopback only. Processes still running from
    that directory at the end are this run's leftovers and are killed.
    """
    import ray

    from rayq.runtime.session import LOOPBACK, loopback_only

    temp_dir = tempfile.mkdtemp(prefix="rq-it-", dir="/tmp")  # short: Ray's socket paths
    saved = {name: os.environ.get(name) for name in ("RAY_ADDRESS", "RAY_TMPDIR")}
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_TMPDIR"] = temp_dir
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    loopback_only()
    ray.init(address="local", num_cpus=2, namespace="rayq", include_dashboard=False,
             log_to_driver=False, _temp_dir=os.path.join(temp_dir, "ray"),
             _node_ip_address=LOOPBACK)
    try:
        yield ray
    finally:
        rayq.shutdown()
        ray.shutdown()
        _kill_started_under(temp_dir)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_started_under(temp_dir: str) -> None:
    """Kill the processes whose command line names ``temp_dir`` (this run's Ray
    and any head a test left running there) and their children; nothing else."""
    import psutil

    mine = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid != os.getpid() and any(temp_dir in arg for arg in proc.info["cmdline"] or ()):
            mine.add(proc)
            with contextlib.suppress(psutil.Error):  # its workers and agents rename themselves
                mine.update(proc.children(recursive=True))
    mine.discard(psutil.Process())
    for proc in mine:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(mine), timeout=10)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")


class ScriptRun(NamedTuple):
    """One run of ``tests/integration/scripts/<name>`` with ``args``, in a process of its
    own (its own simulated cluster or embedded Ray: the test run's Ray is untouched).
    ``data_dir``: the script's first argument is a fresh folder, removed after.
    ``takes_s``: about how long it runs on an idle 2-core machine (the lane runs the
    longest first)."""
    name: str
    args: tuple[str, ...] = ()
    timeout_s: float = 600.0
    data_dir: bool = False
    takes_s: float = 60.0


def run_script(run: ScriptRun) -> tuple[list[dict], subprocess.CompletedProcess]:
    """The JSON lines ``run`` printed, and its process: the run the script lane made
    beside the other tests, or one made now if the lane has none."""
    return _LANE.result(run)


class ScriptLane:
    """The script runs the run's test modules name in ``SCRIPT_RUNS``, one after another,
    on a thread started once the run is collected: their simulated clusters start, lose
    nodes and fail over while the run's other tests go on (a run mostly waits on failure
    detectors and timeouts). Those modules' tests run last, in the lane's order. The
    scripts' Rays live under a temp directory of the lane's own; whatever still runs
    from it when the test run ends is killed."""

    def __init__(self):
        self._runs: dict[ScriptRun, Future] = {}
        self._running: subprocess.Popen | None = None
        self._stopped = False
        self._temp_dir = ""
        self._env: dict[str, str] | None = None

    def start(self, runs: list[ScriptRun]) -> None:
        if not runs:
            return
        self._temp_dir = tempfile.mkdtemp(prefix="rq-lane-", dir="/tmp")  # short: socket paths
        # the environment as the run began: not what a test sets for a while meanwhile
        self._env = {"RAY_DEDUP_LOGS": "0", **os.environ, "RAY_TMPDIR": self._temp_dir}
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="script-lane")
        for run in runs:
            self._runs[run] = pool.submit(self._run, run)
        pool.shutdown(wait=False)

    def result(self, run: ScriptRun) -> tuple[list[dict], subprocess.CompletedProcess]:
        future = self._runs.get(run)
        return future.result() if future is not None else self._run(run)

    def _run(self, run: ScriptRun) -> tuple[list[dict], subprocess.CompletedProcess]:
        from rayq.runtime.session import SINGLE_MACHINE_ENV

        if self._stopped:
            raise RuntimeError(f"the test run ended before {run.name} started")
        env = {**(self._env or os.environ), "PYTHONPATH": ROOT, SINGLE_MACHINE_ENV: "0"}
        env.pop("RAY_ADDRESS", None)
        data_dir = tempfile.mkdtemp(prefix="rq-script-") if run.data_dir else None
        argv = [sys.executable, os.path.join(SCRIPTS, run.name),
                *([data_dir] if data_dir else []), *run.args]
        try:
            with subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) as proc:
                self._running = proc
                try:
                    out, err = proc.communicate(timeout=run.timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
                    raise subprocess.TimeoutExpired(argv, run.timeout_s, out, err) from None
                finally:
                    self._running = None
        finally:
            if data_dir:
                shutil.rmtree(data_dir, ignore_errors=True)
        done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")], done

    def stop(self) -> None:
        """Stop the run in progress and those not begun; kill what runs from the lane's
        temp directory."""
        self._stopped = True
        for future in self._runs.values():
            future.cancel()
        proc = self._running
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            proc.kill()
        if self._temp_dir:
            _kill_started_under(self._temp_dir)
            shutil.rmtree(self._temp_dir, ignore_errors=True)


_LANE = ScriptLane()


def pytest_collection_finish(session):
    """Start the script lane with the runs of the modules this test run selected."""
    if session.config.option.collectonly:
        return
    runs = {run: None for item in session.items for run in script_runs(item)}
    _LANE.start(sorted(runs, key=lambda run: -run.takes_s))


def pytest_sessionfinish(session):
    _LANE.stop()


def start_runtime(tmp_path_factory, config: rayq.Config | None = None, name: str = "rayq"):
    """Stop whatever runtime runs and start a fresh one on a new data directory."""
    rayq.shutdown()
    data_dir = tmp_path_factory.mktemp(name)
    return rayq.start(data_dir=data_dir, config=config or rayq.Config()), data_dir


@contextlib.contextmanager
def sqs_endpoint(tmp_path_factory, name: str, accounts=("acme",)):
    """A fresh runtime without consumers, ``accounts`` made, and the SQS endpoint serving
    on a free loopback port: (url, {account: key}, the admin client). Shut down after."""
    admin, _ = start_runtime(tmp_path_factory, with_consumers(rayq.Config(), 0), name=name)
    keys = {account: admin.create_account(account) for account in accounts}
    url = rayq.serve_sqs(port=free_port())
    try:
        yield url, keys, admin
    finally:
        rayq.shutdown()


def boto3_sqs(url: str, account: str, key: str, region: str = "eu-west-1"):
    """A boto3 SQS client signing as ``account`` (one attempt per call: no retries)."""
    return boto3.client("sqs", endpoint_url=url, region_name=region, aws_access_key_id=account,
                        aws_secret_access_key=key, config=BotoConfig(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory)
    yield client


@pytest.fixture
def queue(client):
    """A fresh queue per test, max_receives 3."""
    return client.create_queue(f"q{next(_names)}", max_receives=3)


def wait_until(observe, timeout_s: float = 30.0, interval_s: float = 0.1, what: str = ""):
    """Poll ``observe()`` until it returns something truthy, and return that; fail the
    test with ``what`` and the last observation after ``timeout_s``. The deadline only
    bounds a hang: a test never asserts how long something took."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = observe()
        if seen:
            return seen
        assert time.monotonic() < deadline, f"gave up waiting for {what or observe}: {seen!r}"
        time.sleep(interval_s)
