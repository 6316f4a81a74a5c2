"""Starting, attaching to and stopping a runtime: what ``rayq.start``, ``rayq.connect``
and ``rayq.shutdown`` are. The one module of the public API that reaches Ray and
the actors; ``rayq/__init__`` loads it on first use."""

from __future__ import annotations

import os
import socket
import sys

import ray

from rayq.names import DEFAULT_RUNTIME, serve
from actors.lifecycle import ensure_runtime, find_runtime, stop_runtime
from rayq import config as config_module
from rayq.client import Client
from rayq.config import Config
from rayq.core.auth.accounts import Signer
from rayq.core.kit.private import prepare_data_dir
from rayq.errors import AuthError, RuntimeFailure
from rayq.remote import call
from rayq.transport import Transports

DEFAULT_DATA_DIR = ".rayq-data"


def default_data_dir(config: Config) -> str:
    """Where a runtime keeps its data unless told: a folder of its own per name."""
    if config.name == DEFAULT_RUNTIME:
        return DEFAULT_DATA_DIR
    return f"{DEFAULT_DATA_DIR}-{config.name}"
LOOPBACK = "127.0.0.1"
DASHBOARD_ENV = "RAYQ_DASHBOARD"  # "0" starts the embedded Ray without its dashboard
# Ray's own switch for a one-machine Ray (its default on macOS and Windows): node
# address 127.0.0.1, and every Ray server (GCS, raylet, workers, agents) on loopback.
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
RAY_LOG_LEVEL_ENV = "RAYQ_RAY_LOG_LEVEL"  # Ray's Python log level in this process
# The transports rayq.connect's clients share in this process (one per address, account
# and key), so that a client per thread still coalesces its sends with the others'.
CONNECTED = Transports()
GCS_CHECK_S = 3.0  # a found cluster's GCS must answer within this, or it is passed over


_QUIET_WORKERS = False


def quiet_workers() -> None:
    """Have a Ray that this process starts or attaches print no worker output here (for
    rayq's own commands: a job keeps Ray's default)."""
    global _QUIET_WORKERS
    _QUIET_WORKERS = True


def _init_ray(address: str | None = None, dashboard: bool = True) -> None:
    """Attach to ``address`` (None or "auto": the cluster ``ray start`` / ``rayq start``
    left on this machine); with no address and no such cluster, start the embedded
    Ray: this machine only, on loopback. A cluster found on the machine whose GCS does
    not answer is said so in one line and passed over (None) or refused ("auto", as
    ``connect`` attaches); one named (``address`` or ``$RAY_ADDRESS``) that does not
    answer raises RuntimeFailure. Raises ConnectionError for "auto" when no cluster runs."""
    if ray.is_initialized():
        return
    level = os.environ.get(RAY_LOG_LEVEL_ENV, "WARNING").upper()
    # a job's Ray as Ray makes it: its namespace, and its workers' output on its console
    # (rayq's own commands keep that in Ray's log files: quiet_workers)
    quiet = {"log_to_driver": False} if _QUIET_WORKERS else {}
    found = live_cluster(address)
    if found is None:
        loopback_only()
        # "local": a new Ray even where ray_current_cluster names one (that does not answer).
        ray.init(address="local", logging_level=level, _node_ip_address=LOOPBACK,
                 include_dashboard=dashboard, dashboard_host=LOOPBACK, **quiet)
        return
    if found.rsplit(":", 1)[0] == LOOPBACK:  # rayq start's head: join it on loopback
        loopback_only()
    # The address as given: for None / "auto" Ray also loads the cluster's auth token.
    ray.init(address=address, logging_level=level, **quiet)


def live_cluster(address: str | None, say=lambda line: print(line, file=sys.stderr)) -> str | None:
    """The cluster to attach to for ``address`` (see :func:`_init_ray`), its GCS checked
    within GCS_CHECK_S; None: start one. ``say`` hears the line about a cluster passed over."""
    named = address not in (None, "auto") or bool(os.environ.get("RAY_ADDRESS"))
    found = local_cluster(address) if address in (None, "auto") else address
    if found is None or gcs_answers(found):
        return found
    if named:
        raise RuntimeFailure(f"the Ray at {found} does not answer (its GCS did not reply "
                             f"within {GCS_CHECK_S:.0f} s)")
    where = f"the Ray at {found} (named in {ray_address_file()}) does not answer"
    if address == "auto":
        raise RuntimeFailure(f"{where}; start one with `rayq start`")
    say(f"rayq: {where}; starting an embedded Ray instead")
    return None


def gcs_answers(address: str, timeout_s: float = GCS_CHECK_S) -> bool:
    """Whether a Ray GCS answers at ``address`` (host:port) within about ``timeout_s``:
    a TCP connect, then one small gRPC call (any reply counts, an auth refusal too).
    Addresses of other forms (ray://, http://) are not checked: True."""
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return True
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError:
        return False
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.CheckAlive(gcs_service_pb2.CheckAliveRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED)
    return True


def local_cluster(address: str | None) -> str | None:
    """The address ``ray.init(address)`` would attach to: ``$RAY_ADDRESS`` or the
    cluster last started on this machine with ``ray start`` (None: none)."""
    from ray._private.services import get_ray_address_from_environment

    found = get_ray_address_from_environment(address, None)
    return None if found in (None, "local") else found


def ray_address_file() -> str:
    """Where ``ray start`` leaves the address of the cluster it started."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


def loopback_only() -> None:
    """Make the Ray started next from this process (and every process it starts)
    listen on 127.0.0.1 only. Without this Ray turns 127.0.0.1 into the machine's
    network address and its servers listen there."""
    from ray._private import ray_constants

    os.environ[SINGLE_MACHINE_ENV] = "0"        # Ray's processes read it at start-up
    ray_constants.ENABLE_RAY_CLUSTER = False    # this one read it at import


def _dashboard_wanted(dashboard: bool | None) -> bool:
    if dashboard is not None:
        return dashboard
    return os.environ.get(DASHBOARD_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def start(data_dir: str | os.PathLike | None = None, config: Config | None = None,
          consumers: int | None = None, dashboard: bool | None = None) -> Client:
    """Start the runtime (idempotent) and return a client.

    Starts a local Ray unless one is initialised, ``RAY_ADDRESS`` names a cluster
    or ``ray start`` / ``rayq start`` left one on this machine. That embedded Ray
    listens on 127.0.0.1 only and runs the Ray dashboard (also on 127.0.0.1)
    unless ``dashboard=False`` or ``$RAYQ_DASHBOARD=0``. Data lives in
    ``data_dir`` (default ``./.rayq-data``, or ``./.rayq-data-<name>`` for a runtime named
    by ``Config.name``), created mode 0700; a data directory other users may read raises
    DataDirExposed. If a runtime of this name already runs, it is reused with its own
    configuration. Runtimes of other names on the same cluster are left alone; this
    process talks to this one from now on.
    """
    config = config or config_module.load()
    serve(config.name)
    if consumers is not None:
        config = config_module.with_consumers(config, consumers)
    _init_ray(os.environ.get("RAY_ADDRESS"), _dashboard_wanted(dashboard))
    try:  # a running runtime is reused with its own configuration and data directory
        found = find_runtime()
    except RuntimeFailure:
        ensure_runtime(prepare_data_dir(os.path.abspath(data_dir or default_data_dir(config))),
                       config, consumers)
        found = find_runtime()
    else:
        if consumers is not None:
            call(lambda: found["manager"].scale_consumers.remote(consumers))
    return Client(found["manager"], found["shards"], found["config"])


def connect(address: str = "auto", account: str | None = None, key: str | None = None,
            name: str | None = None) -> Client:
    """Attach to a running runtime (also from inside Ray tasks and actors): the one called
    ``name`` (``Config.name``; default: the one this process talks to already, else the
    default runtime), which this process talks to from now on.

    With ``account`` and ``key`` every request is signed (HMAC-SHA256) and the
    client sees and touches only that account's queues and messages; the
    credentials are checked here, so wrong ones raise AuthError at once.
    Without them the client acts for the ``default`` account.

    The clients connected in one process with the same address, account and key share
    one transport: sends from their threads to one queue coalesce into shared puts
    (a client per thread sends as fast as one client shared by the threads).
    """
    if (account is None) != (key is None):
        raise AuthError("connect takes both account= and key=, or neither")
    signer = Signer(account, key) if account is not None else None
    if name is not None:
        serve(Config(name=name).name)  # checked as a configuration's name is
    _init_ray(address)
    found = find_runtime()
    transport = CONNECTED.get(address, account, key, found, signer)
    client = Client(found["manager"], found["shards"], found["config"], signer,
                    transport=transport)
    if signer is not None:
        client.whoami()
    return client


def shutdown() -> None:
    """Stop the actors of the runtime this process talks to (its namespace's only: a
    job's own actors, and other runtimes, are left alone); the data stays. Idempotent."""
    if not ray.is_initialized():
        return
    stop_runtime()
