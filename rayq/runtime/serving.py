"""Serving the SQS endpoint on a running runtime: what ``rayq.serve_sqs`` and
``rayq serve`` are. Like :mod:`rayq.runtime.session`, a public-API module that reaches
Ray and the actors; ``rayq/__init__`` loads it on first use."""

from __future__ import annotations

import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayq.names import namespace, server_env
from actors.control import control_starter
from actors.controlstore import forget_place, register_launcher
from actors.data_nodes import data_nodes
from actors.lifecycle import find_runtime
from rayq.sqs.service import SqsEndpointRemote, replica_name, set_sqs_home_region
from rayq.core.control.control_places import SQS_STORE
from rayq.core.codec.model import check_count
from rayq.core.kit.private import check_private_key
from rayq.errors import InvalidMessage, RayqError, RuntimeFailure
from rayq.remote import NO_RETRY, call
from rayq.sqs.names import HOME_REGION, valid_region

# Endpoint actors only parse, verify and forward: no CPU slot taken from consumers.
def _options() -> dict:
    return dict(namespace=namespace(), lifetime="detached", get_if_exists=True, num_cpus=0,
                max_restarts=-1, runtime_env=server_env())


def serve_sqs(host: str = "127.0.0.1", port: int = 9324, replicas: int = 1, *,
              tls_cert: str | None = None, tls_key: str | None = None,
              home_region: str = HOME_REGION) -> str:
    """Serve the SQS protocols for the running runtime at ``http://host:port``
    (``https://`` with ``tls_cert`` and ``tls_key``, PEM files readable at the same
    paths on every node); returns that URL. ``replicas`` HTTP actors per node share the
    port (SO_REUSEPORT); on a cluster each alive node runs that many. Idempotent;
    stopped by ``rayq.shutdown()``. The queues of ``home_region`` are rayq's queues of the
    same names; another region's are ``<region>.<name>``. Raises InvalidMessage for a
    lone or missing TLS file or a malformed region, KeyExposed for a key file
    other users may read,
    RuntimeFailure when no runtime runs or the port cannot be bound."""
    check_count(port, "port", 1, 65535)
    check_count(replicas, "replicas", 1, 64)
    tls = _tls_files(tls_cert, tls_key)
    if not valid_region(home_region):
        raise InvalidMessage(f"not a region name: {home_region!r:.40}")
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    found = find_runtime()
    config = found["config"]
    data_dir = ray.get(found["manager"].info.remote())["data_root"]  # unsigned: the runtime's own
    # the state's store is a control store: placed, kept on copies, failed over by itself
    set_sqs_home_region(home_region)
    register_launcher(SQS_STORE, "rayq.sqs.service:launch_state")
    state = control_starter(data_nodes(config), data_dir, config, (SQS_STORE,))(SQS_STORE)
    ray.get(state.ping.remote())
    endpoints = []
    for n, node in enumerate(_alive_nodes()):
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        for i in range(replicas):
            endpoints.append(SqsEndpointRemote.options(
                name=replica_name(n * replicas + i), scheduling_strategy=strategy,
                max_concurrency=1000, **_options()).remote(
                    host, port, found["manager"], found["shards"], config, tls=tls,
                    home_region=home_region))
    try:
        addresses = set(ray.get([e.ready.remote() for e in endpoints]))
    except ray.exceptions.RayError as err:
        raise RuntimeFailure(f"the SQS endpoint could not listen on {host}:{port}: {err}") from err
    if addresses != {(host, port)}:  # replicas of an earlier call, elsewhere
        raise RuntimeFailure(f"the SQS endpoint already serves at {sorted(addresses)}; "
                             "stop it first (rayq.shutdown())")
    return f"{'https' if tls else 'http'}://{host}:{port}"


def _tls_files(cert: str | None, key: str | None) -> tuple[str, str] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidMessage("TLS takes both a certificate and its key file")
    missing = [path for path in (cert, key) if not os.path.isfile(path)]
    if missing:
        raise InvalidMessage(f"no such TLS file: {missing[0]}")
    check_private_key(key)
    return os.path.abspath(cert), os.path.abspath(key)


def _alive_nodes() -> list[str]:
    return sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])


def stop_sqs() -> None:
    """Stop the endpoint's replicas and its state actor (named ``rayq-sqs-*``); the
    runtime keeps running. Idempotent."""
    forget_place(SQS_STORE)  # nobody restarts the state: it stops on purpose
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == namespace() and a["name"].startswith(replica_name(""))]
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=namespace()), no_restart=True)
        except ValueError:
            pass  # gone meanwhile
    try:  # and the connections replicas handed to shards (rayq.handoff)
        shards = find_runtime()["shards"]
    except RuntimeFailure:
        return
    for shard in shards:
        try:
            call(lambda: shard.close_door.remote(), NO_RETRY)
        except RayqError:
            pass  # down: it restarts without them
