"""Transport: how a Client and its Queues reach a runtime. One object holds what they
share: the actor handles, the signer, the route cache and the producers (one per
queue, :mod:`rayq.sending`).

A transport signs every request with one set of credentials. Clients that
``rayq.connect`` to one runtime with the same address, account and key share a
transport (:class:`Transports`), so their threads' sends coalesce into shared puts;
clients with different keys never share one, so none signs for another (before or
after a key rotation). A transport no client holds any more goes, producers and
all.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import ray

from rayq.config import Config
from rayq.core.auth.accounts import ADMIN, ReplayedRequest, Signature, Signer
from rayq.core.auth.gate import Vouched
from rayq.core.auth.operations import MANAGER_OPS, Operation
from rayq.core.kit.clock import SystemClock
from rayq.core.control.registry import QueueInfo
from rayq.core.control.routes import Route, RouteCache
from rayq.core.kit.retry import RetrySchedule
from rayq.errors import RuntimeFailure
from rayq.remote import NO_RETRY, RETRY, ShardLinks, call, call_async
from rayq.channel import ShardLink
from rayq.sending import Producer
from rayq.steps import Request, Steps, drive, drive_async


class Transport:
    """A connection to one runtime, shared by the clients of one credential
    (see the module docstring)."""

    def __init__(self, manager, shards: Sequence, config: Config, signer: Signer | None = None):
        self.manager = manager
        # hot calls to a shard on this host go over its local channel (rayq.channel); a
        # shard scaling added is linked when a queue's subqueue names it
        self.shards = shards if isinstance(shards, ShardLinks) else ShardLinks(
            0, config.store.local_channel,
            (s if isinstance(s, ShardLink) else ShardLink(s, config.store.local_channel)
             for s in shards))
        self.config = config
        self._signer = signer
        self._routes = RouteCache(SystemClock())
        self._producers: dict[str, Producer] = {}
        self._producers_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Transport({self.account!r}, shards={len(self.shards)})"

    @property
    def account(self) -> str:
        """The account requests act for: the signer's, or ``default`` when unsigned."""
        return self._signer.account if self._signer else ADMIN

    # -- requests ----------------------------------------------------------------
    def sign(self, operation: Operation, *args: Any, queue: str | None = None,
             **kwargs: Any) -> Signature | None:
        """The signature of one request of ``operation`` over exactly these arguments,
        bound by name (None when unsigned); ``queue``: see :meth:`Signer.sign`."""
        if self._signer is None:
            return None
        return self._signer.sign(operation, *args, queue=queue, **kwargs)

    def request(self, operation: Operation, handle, *args: Any, queue: str | None = None,
                **kwargs: Any) -> ray.ObjectRef:
        """``handle.<method>.remote(*args, **kwargs)``, signed over exactly those arguments
        (vouched for instead when the shard runs in this very process: its gate checks
        no digest of its own process's calls)."""
        if self._signer is not None and isinstance(handle, ShardLink) and handle.in_process():
            if queue is None:
                queue = operation.signed_queue(operation.bind(*args, **kwargs))
            auth = Vouched(self._signer.account, queue)
        else:
            auth = self.sign(operation, *args, queue=queue, **kwargs)
        return getattr(handle, operation.method).remote(*args, auth=auth, **kwargs)

    def call(self, operation: Operation, handle, *args: Any, queue: str | None = None,
             schedule: RetrySchedule | None = None, **kwargs: Any) -> Any:
        """A signed request's result; retried (signed anew) while the actor restarts.

        Ray re-delivers a call that met an actor restart with its arguments, signature
        included; if the first delivery's nonce was stored before the restart, the
        runtime refuses the second as a replay. This transport signed the request
        once, so that refusal is its own call coming back: it is signed anew and sent
        once more (at least once, as for any call retried over a restart).
        """
        def send() -> Any:
            return call(lambda: self.request(operation, handle, *args, queue=queue, **kwargs),
                        schedule or RETRY)
        try:
            return send()
        except ReplayedRequest:
            return send()

    async def call_async(self, operation: Operation, handle, *args: Any,
                         queue: str | None = None, schedule: RetrySchedule | None = None,
                         **kwargs: Any) -> Any:
        """:meth:`call` awaited: no thread waits for the answer (a parked long poll)."""
        def send() -> Any:
            return call_async(lambda: self.request(operation, handle, *args, queue=queue,
                                                   **kwargs), schedule or RETRY)
        try:
            return await send()
        except ReplayedRequest:
            return await send()

    def run(self, steps: Steps) -> Any:
        """The result of ``steps`` (:data:`Steps`), each request made with :meth:`call`."""
        return drive(steps, lambda r: self.call(r.operation, r.handle, *r.args,
                                                schedule=r.schedule, **r.kwargs))

    async def run_async(self, steps: Steps) -> Any:
        """:meth:`run` on an event loop, each request awaited with :meth:`call_async`."""
        return await drive_async(steps, lambda r: self.call_async(
            r.operation, r.handle, *r.args, schedule=r.schedule, **r.kwargs))

    def shard_of(self, queue: QueueInfo, sq: int):
        """The handle of the shard that holds subqueue ``sq`` of ``queue``."""
        return self.shards[queue.subqueue(sq).shard]

    # -- routing -------------------------------------------------------------------
    def route(self, name: str, refresh: bool = False) -> Route:
        """(queue, receive order, the put subqueue this transport uses), kept for
        rayq.core.control.routes.ROUTE_TTL_S; a refreshed route keeps our put subqueue while it
        takes puts (enqueuer affinity)."""
        return self.run(self.route_steps(name, refresh))

    def route_steps(self, name: str, refresh: bool = False) -> Steps:
        """:meth:`route` as :data:`Steps` (a request to the manager only when not cached)."""
        kept = None if refresh else self._routes.get(name)
        if kept is not None:
            return kept
        stale = None if refresh else self._routes.stale(name)
        try:
            queue, order, target = yield Request(MANAGER_OPS["routing"], self.manager, (name,),
                                                 schedule=None if stale is None else NO_RETRY)
        except RuntimeFailure as err:
            return self._routes.renew(name, err)  # the manager is away: the shards are not
        return self._routes.put(name, queue, order, target)

    def forget_route(self, name: str) -> None:
        self._routes.forget(name)

    # -- sending ---------------------------------------------------------------------
    def producer(self, name: str) -> Producer:
        """The one producer of queue ``name`` over this transport: every sender to that
        queue through it, on any thread, shares its puts."""
        with self._producers_lock:
            producer = self._producers.get(name)
            if producer is None:
                producer = self._producers[name] = Producer(self, name)
            return producer

    def serves(self, manager, shards: Sequence) -> bool:
        """Whether this transport reaches the runtime of ``manager`` and ``shards`` (actor
        handles or shard links): False once that runtime was stopped and started again."""
        return _actor_id(self.manager) == _actor_id(manager) and all(
            _actor_id(mine) == _actor_id(theirs) for mine, theirs in zip(self.shards, shards))


def _actor_id(shard: Any) -> Any:
    """The actor a shard handle or :class:`~rayq.channel.ShardLink` reaches now (None
    for a link whose actor is not running: it fails over)."""
    try:
        return getattr(shard, "handle", shard)._actor_id
    except RuntimeFailure:
        return None


class Transports:
    """The transports of one process, one per (address, account, key): the clients
    :func:`rayq.connect` makes with the same ones share it. Held weakly: a transport goes
    with the last client using it. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kept: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def get(self, address: Hashable, account: str | None, key: str | None, runtime: dict,
            signer: Signer | None) -> Transport:
        """The shared transport of these credentials to ``runtime`` (find_runtime's
        ``manager``, ``shards`` and ``config``), made with ``signer`` if there is none
        or the one kept reaches a runtime since stopped."""
        # The key is kept as a digest: the signer alone holds the secret.
        name = (address, account, None if key is None else hashlib.sha256(key.encode()).digest())
        with self._lock:
            kept = self._kept.get(name)
            if kept is None or not kept.serves(runtime["manager"], runtime["shards"]):
                kept = self._kept[name] = Transport(runtime["manager"], runtime["shards"],
                                                    runtime["config"], signer)
            return kept
