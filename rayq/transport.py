"""Transport: how a Client and its Queues reach a runtime. One object holds what they
share: the actor handles, the signer, the route cache and the send coalescers.

Each client owns its own transport, so every request it makes is signed with its
own credentials (two clients of one account in one process never sign for each
other, before or after a key rotation), and a dropped client takes its
coalescers with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import ray

from rayq.config import Config
from rayq.core.auth.accounts import ADMIN, ReplayedRequest, Signature, Signer
from rayq.core.auth.operations import MANAGER_OPS, Operation
from rayq.core.kit.clock import SystemClock
from rayq.core.codec.model import NewMessage
from rayq.core.control.registry import QueueInfo
from rayq.core.control.routes import Route, RouteCache
from rayq.remote import call
from rayq.channel import ShardLink
from rayq.sending import SendCoalescer


class Transport:
    """A session's connection to one runtime (see the module docstring)."""

    def __init__(self, manager, shards: Sequence, config: Config, signer: Signer | None = None):
        self.manager = manager
        # hot calls to a shard on this host go over its local channel (rayq.channel)
        self.shards = tuple(s if isinstance(s, ShardLink) else ShardLink(s, config.store.local_channel)
                            for s in shards)
        self.config = config
        self._signer = signer
        self._routes = RouteCache(SystemClock())
        self._senders: dict[str, SendCoalescer] = {}
        self._senders_lock = threading.Lock()

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
        """``handle.<method>.remote(*args, **kwargs)``, signed over exactly those arguments."""
        auth = self.sign(operation, *args, queue=queue, **kwargs)
        return getattr(handle, operation.method).remote(*args, auth=auth, **kwargs)

    def call(self, operation: Operation, handle, *args: Any, queue: str | None = None,
             **kwargs: Any) -> Any:
        """A signed request's result; retried (signed anew) while the actor restarts.

        Ray re-delivers a call that met an actor restart with its arguments, signature
        included; if the first delivery's nonce was stored before the restart, the
        runtime refuses the second as a replay. This transport signed the request
        once, so that refusal is its own call coming back: it is signed anew and sent
        once more (at least once, as for any call retried over a restart).
        """
        def send() -> Any:
            return call(lambda: self.request(operation, handle, *args, queue=queue, **kwargs))
        try:
            return send()
        except ReplayedRequest:
            return send()

    def shard_of(self, queue: QueueInfo, sq: int):
        """The handle of the shard that holds subqueue ``sq`` of ``queue``."""
        return self.shards[queue.subqueue(sq).shard]

    # -- routing -------------------------------------------------------------------
    def route(self, name: str, refresh: bool = False) -> Route:
        """(queue, receive order, this session's put subqueue), kept for
        rayq.core.control.routes.ROUTE_TTL_S; a refreshed route keeps our put subqueue while it
        takes puts (enqueuer affinity)."""
        kept = None if refresh else self._routes.get(name)
        if kept is not None:
            return kept
        queue, order, target = self.call(MANAGER_OPS["routing"], self.manager, name)
        return self._routes.put(name, queue, order, target)

    def forget_route(self, name: str) -> None:
        self._routes.forget(name)

    # -- sending ---------------------------------------------------------------------
    def send(self, name: str, messages: list[NewMessage],
             flush: Callable[[list[NewMessage]], list]) -> list:
        """Put ``messages`` to queue ``name`` through this transport's coalescer of that
        queue: concurrent senders on any thread share one durable put call."""
        with self._senders_lock:
            sender = self._senders.get(name)
            if sender is None:
                sender = self._senders[name] = SendCoalescer()
        return sender.send(messages, flush)
