"""The control stores' places in Ray's GCS, and the calls a control store's leader
makes through Ray (docs/replication.md, "The control plane").

The leader's logic is :class:`rayq.core.control.control_store.ControlReplication`; this
module claims epochs in the GCS and calls the copies (:class:`actors.control.ControlFollower`,
one per data node, ``rayq-control-<node>``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from collections.abc import Callable

import ray
import ray.experimental.internal_kv as internal_kv

from rayq.config import Config
from rayq.names import namespace
from actors.replication.leader import copy_store
from rayq.core.control.placement import DataNode, still_draining
from rayq.core.control.control_places import (ALL_STORES, ControlPlace, claim_key,
                                              claim_prefix, decode_place, encode_place,
                                              given_up, newest_key)
from rayq.core.kit.kv import LmdbKV, WriteSet
from rayq.errors import RuntimeFailure
from rayq.remote import NO_RETRY, call

CONTROL_FOLLOWER_PREFIX = "rayq-control-"
COPY_TIMEOUT_S = 5.0     # a copy slower than this to apply a write set leaves the in-sync set
SEED_TIMEOUT_S = 10.0    # a whole store (a few megabytes) copied to a new copy


def control_follower_name(node: str) -> str:
    return f"{CONTROL_FOLLOWER_PREFIX}{node}"


def current_place(store: str) -> ControlPlace | None:
    """``store``'s place of the highest epoch claimed (None: never placed)."""
    keys = internal_kv._internal_kv_list(claim_prefix(store), namespace=namespace())
    key = newest_key(keys)
    return None if key is None else _place_at(key)


def given_up_node(store: str) -> str | None:
    """The node whose leader of ``store`` the newest failover gave up on (None: none)."""
    keys = sorted(internal_kv._internal_kv_list(claim_prefix(store), namespace=namespace()))
    return given_up(*map(_place_at, keys[-2:])) if len(keys) > 1 else None


def _place_at(key: bytes) -> ControlPlace:
    return decode_place(internal_kv._internal_kv_get(key, namespace=namespace()))


def claim(place: ControlPlace) -> bool:
    """Record ``place`` as its store's place if nobody claimed its epoch yet; whether
    this caller did (the GCS writes a key only if absent: one winner per epoch)."""
    existed = internal_kv._internal_kv_put(claim_key(place), encode_place(place),
                                           overwrite=False, namespace=namespace())
    return not existed


LAUNCHER_KEY = b"rayq/launcher/"  # in Ray's GCS: per store served from above, its launcher


def register_launcher(store: str, launcher: str) -> None:
    """Have the control plane start ``store``'s actor with ``launcher`` (``module:function``,
    called as ``function(home, config)`` for its Ray class, arguments and options): the
    layer above the actors (the SQS service) registers the control store it serves,
    so the control plane can start it anywhere without importing that layer."""
    internal_kv._internal_kv_put(LAUNCHER_KEY + store.encode(), launcher.encode(),
                                 overwrite=True, namespace=namespace())


def registered_launcher(store: str) -> Callable[[str, Config], tuple]:
    """The launcher registered for ``store``; RuntimeFailure when none is."""
    raw = internal_kv._internal_kv_get(LAUNCHER_KEY + store.encode(), namespace=namespace())
    if not raw:
        raise RuntimeFailure(f"no launcher is registered for control store {store!r}")
    module, _, function = raw.decode().partition(":")
    return getattr(importlib.import_module(module), function)


DRAINING_KEY = b"rayq/draining"  # in Ray's GCS: the data nodes being drained (JSON list)


def drain_marks() -> dict[str, str]:
    """The data nodes marked for a drain (``client.drain``), by name: the Ray node id of
    the node that was marked (see :func:`~rayq.core.control.placement.still_draining`)."""
    raw = internal_kv._internal_kv_get(DRAINING_KEY, namespace=namespace())
    return json.loads(raw) if raw else {}


def set_drain_marks(marks: dict[str, str]) -> None:
    internal_kv._internal_kv_put(DRAINING_KEY, json.dumps(marks, sort_keys=True).encode(),
                                 overwrite=True, namespace=namespace())


def draining_nodes(nodes: list[DataNode]) -> frozenset[str]:
    """The names among ``nodes`` (alive data nodes) being drained: nothing new goes there,
    and what they hold moves off."""
    return still_draining(drain_marks(), nodes)


def every_place() -> dict[str, ControlPlace]:
    return {store: place for store in ALL_STORES
            if (place := current_place(store)) is not None}


def forget_place(store: str) -> None:
    """Drop ``store``'s claims: nobody watches it any more (the SQS endpoint stopped). A
    later start rebuilds its place from the copies on the disks."""
    internal_kv._internal_kv_del(claim_prefix(store), del_by_prefix=True, namespace=namespace())


def _copy_of(node: str):
    return ray.get_actor(control_follower_name(node), namespace=namespace())


class RayControlPeers:
    """:class:`~rayq.core.control.control_store.ControlPeers` through Ray: the places
    in the GCS, the copies on each node's control follower (``rayq-control-<node>``),
    each call bounded in time; ``start(node)`` starts that node's follower."""

    def __init__(self, start: Callable[[str], None] | None):
        self._start = start

    place = staticmethod(current_place)
    claim = staticmethod(claim)
    places = staticmethod(every_place)

    def apply(self, node: str, store: str, epoch: int, seq: int, sets: list[WriteSet]) -> int:
        copy = _copy_of(node)
        return call(lambda: copy.apply.remote(store, epoch, seq, sets), NO_RETRY,
                    timeout_s=COPY_TIMEOUT_S)

    def state(self, node: str, store: str) -> tuple[int, int]:
        copy = _copy_of(node)
        return call(lambda: copy.state.remote(store), NO_RETRY, timeout_s=COPY_TIMEOUT_S)

    def install(self, node: str, store: str, data: bytes, epoch: int, seq: int) -> None:
        copy = _copy_of(node)
        call(lambda: copy.install.remote(store, data, epoch, seq), NO_RETRY,
             timeout_s=SEED_TIMEOUT_S)

    def start(self, node: str) -> None:
        if self._start is not None:
            self._start(node)

    @staticmethod
    def snapshot(kv: LmdbKV) -> bytes:
        """The store as one LMDB file, as of one read transaction (copied private)."""
        folder = f"{kv.env.path().rstrip(os.sep)}.seeding"  # one per store: they seed at once
        try:
            copy_store(kv, folder)
            with open(os.path.join(folder, "data.mdb"), "rb") as copy:
                return copy.read()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
