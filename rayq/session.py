"""Starting, attaching to and stopping a runtime: what ``rayq.start``, ``rayq.connect``
and ``rayq.shutdown`` are. The one module of the public API that reaches Ray and
the actors; ``rayq/__init__`` loads it on first use."""

from __future__ import annotations

import os

import ray

from actors.runtime import ensure_runtime, find_runtime, stop_runtime
from rayq import config as config_module
from rayq.client import Client
from rayq.config import Config
from rayq.core.auth import Signer
from rayq.errors import AuthError

DEFAULT_DATA_DIR = ".rayq-data"


def _init_ray(address: str | None = None) -> None:
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
    if not ray.is_initialized():
        return
    stop_runtime()
