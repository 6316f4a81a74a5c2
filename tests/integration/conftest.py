"""One local Ray per test session; runtimes are restarted per module when configs differ."""

import itertools
import os
import time
from pathlib import Path

import pytest

import rayq

_names = itertools.count()
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/integration, so ``-m "not integration"`` deselects them.

    (A ``pytestmark`` in a conftest applies to nothing: only test modules read it.)
    A conftest hook sees the whole session's items, so filter by path.
    """
    for item in items:
        if _HERE in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    ray.init(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    yield ray
    rayq.shutdown()
    ray.shutdown()


def start_runtime(tmp_path_factory, config: rayq.Config | None = None, name: str = "rayq"):
    """Stop whatever runtime runs and start a fresh one on a new data directory."""
    rayq.shutdown()
    data_dir = tmp_path_factory.mktemp(name)
    return rayq.start(data_dir=data_dir, config=config or rayq.Config()), data_dir


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
