"""rayq: a durable, multi-tenant message queue and fair scheduling runtime on Ray.

    client = rayq.start()                 # embedded: local Ray, data in ./.rayq-data

    @rayq.task(type="report")
    def build_report(org_id): ...
    ray.get(client.submit(build_report, 42, tenant="acme"))

    q = client.create_queue("jobs")
    q.send({"report": 42}, tenant="acme", type="report")
    for m in q.receive(max_messages=10, wait_s=5):
        ...
        q.delete(m.receipt)
"""

from __future__ import annotations

import os

from typing import TYPE_CHECKING

from rayq.config import (Config, ConsumerConfig, FairnessConfig, FloodConfig, ScalingConfig,
                         StoreConfig)
from rayq.core.model import Outgoing, Received
from rayq.core.fairness import FairnessReport
from rayq.core.flood import Flooder
from rayq.core.rules import SuspensionRule
from rayq.core.tasks import TaskFunction, task
from rayq.errors import (AuthError, InvalidMessage, MessageTooLarge, Overloaded, QueueDisabled,
                         QueueExists, QueueNotFound, RayqError, ReceiptInvalid, RuntimeFailure,
                         StoreError, TaskError, UsageError)

if TYPE_CHECKING:
    from rayq.client import Client, KeyStats, Queue, QueueStats

DEFAULT_DATA_DIR = ".rayq-data"
# Names that need Ray are imported on first use, so that importing rayq.core
# (or rayq.config, rayq.errors) never loads Ray.
_CLIENT_NAMES = frozenset({"Client", "Queue", "QueueStats", "KeyStats", "Report"})

__all__ = [
    "start", "connect", "shutdown", "Client", "Queue", "QueueStats", "KeyStats", "Report",
    "Config", "ConsumerConfig", "FairnessConfig", "FloodConfig", "ScalingConfig", "StoreConfig",
    "Outgoing", "Received", "task", "TaskFunction", "FairnessReport", "SuspensionRule",
    "Flooder",
    "AuthError", "InvalidMessage", "MessageTooLarge", "Overloaded", "QueueDisabled",
    "QueueExists", "QueueNotFound", "RayqError", "ReceiptInvalid", "RuntimeFailure",
    "StoreError", "TaskError", "UsageError",
]


def __getattr__(name: str):
    if name in _CLIENT_NAMES:
        from rayq import client

        return getattr(client, name)
    raise AttributeError(f"module 'rayq' has no attribute {name!r}")


def _init_ray(address: str | None = None) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=address, namespace="rayq", log_to_driver=False,
                 include_dashboard=False if address is None else None)


def start(data_dir: str | os.PathLike | None = None, config: Config | None = None,
          consumers: int | None = None) -> Client:
    """Start the runtime (idempotent) and return a client.

    Starts a local Ray unless one is initialised or ``RAY_ADDRESS`` names a
    cluster; data lives in ``data_dir`` (default ``./.rayq-data``). If a
    runtime already runs, it is reused with its own configuration.
    """
    from actors.runtime import ensure_runtime, find_runtime

    from rayq import config as config_module
    from rayq.client import Client

    config = config or config_module.load()
    if consumers is not None:
        config = config_module.with_consumers(config, consumers)
    data_dir = os.path.abspath(data_dir or DEFAULT_DATA_DIR)
    _init_ray(os.environ.get("RAY_ADDRESS"))
    ensure_runtime(data_dir, config, consumers)
    found = find_runtime()
    return Client(found["manager"], found["shards"], found["config"])


def connect(address: str = "auto", account: str | None = None, key: str | None = None) -> Client:
    """Attach to a running runtime (also from inside Ray tasks and actors).

    With ``account`` and ``key`` every request is signed (HMAC-SHA256) and the
    client sees and touches only that account's queues and messages; the
    credentials are checked here, so wrong ones raise AuthError at once.
    Without them the client acts for the ``default`` account.
    """
    from actors.runtime import find_runtime

    from rayq.client import Client
    from rayq.core.auth import Signer

    if (account is None) != (key is None):
        raise AuthError("connect takes both account= and key=, or neither")
    signer = Signer(account, key) if account is not None else None
    _init_ray(address)
    found = find_runtime()
    client = Client(found["manager"], found["shards"], found["config"], signer)
    if signer is not None:
        client.whoami()
    return client


def shutdown() -> None:
    """Stop the runtime's actors; the data stays. Idempotent."""
    import ray

    if not ray.is_initialized():
        return
    from actors.runtime import stop_runtime

    stop_runtime()
