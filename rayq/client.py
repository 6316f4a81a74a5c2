"""Client: a session with a runtime, over its actor handles: queue administration,
tasks, accounts, fairness, flooders and analytics. Queue operations are in
:mod:`rayq.queue`; the client routes them (routes cached for a moment)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray import cloudpickle

from actors import COORDINATOR, FLOOD_DETECTOR

from rayq.analytics.report import Report
from rayq.config import Config
from rayq.core.auth import ADMIN, Signature, Signer
from rayq.core.model import (NewMessage, SubqueueState, check_count, check_name, check_seconds,
                             fairness_key)
from rayq.core.fairness import FairnessReport
from rayq.core.flood import Flooder
from rayq.core.registry import QueueInfo, check_queue_name
from rayq.core.rules import SuspensionRule
from rayq.core.tasks import TallyRow, TaskFunction, encode_call
from rayq.errors import InvalidMessage, RuntimeFailure
from rayq.queue import Queue
from rayq.remote import call, named

ROUTE_TTL_S = 2.0


class Client:
    """A session with a rayq runtime. Build it with ``rayq.start()`` or ``rayq.connect()``."""

    def __init__(self, manager, shards: Sequence, config: Config, signer: Signer | None = None):
        self._manager = manager
        self._shards = list(shards)
        self.config = config
        self._signer = signer
        self._routes: dict[str, tuple[float, QueueInfo, list[int], int]] = {}
        self._registered: dict[str, tuple] = {}  # type -> (spec, pickled handler) sent

    # -- accounts ------------------------------------------------------------
    @property
    def account(self) -> str:
        """The account this client acts for: its signer's, or ``default`` when unsigned."""
        return self._signer.account if self._signer else ADMIN

    def _auth(self, queue: str, operation: str, *args: Any) -> Signature | None:
        """The signature of one request (None for an unsigned client)."""
        return self._signer.sign(queue, operation, *args) if self._signer else None

    def _request(self, method, queue: str, operation: str, *args: Any) -> ray.ObjectRef:
        """``method.remote(*args)``, signed over exactly those arguments."""
        return method.remote(*args, auth=self._auth(queue, operation, *args))

    def whoami(self) -> str:
        """The account the runtime sees this client as (checks the credentials)."""
        return call(lambda: self._request(self._manager.whoami, "", "whoami"))

    def create_account(self, name: str) -> str:
        """Create account ``name`` (``default`` account only); returns its primary key.
        Hand it to the account's owner: ``rayq.connect(account=name, key=key)``."""
        return call(lambda: self._request(self._manager.create_account, "", "create_account", name))

    def rotate_key(self, slot: int = 1, account: str | None = None) -> str:
        """Replace key ``slot`` (1 or 2) of ``account`` (``default`` account only; default:
        this client's own); returns the new key. The other slot's key keeps working, so
        clients move over one slot at a time; the replaced key is refused from now on."""
        account = self.account if account is None else account
        return call(lambda: self._request(self._manager.rotate_key, "", "rotate_key", account, slot))

    # -- administration ------------------------------------------------------
    def create_queue(self, name: str, subqueues: int = 1, max_receives: int | None = 5) -> "Queue":
        """Create a queue and its ``<name>-dlq`` (idempotent); returns the queue. It belongs
        to this client's account; a name another account owns raises AuthError."""
        check_queue_name(name)
        call(lambda: self._request(self._manager.create_queue, name, "create_queue",
                                   name, subqueues, max_receives))
        self._routes.pop(name, None)
        return Queue(self, name)

    def queue(self, name: str) -> "Queue":
        """The queue called ``name``. Raises QueueNotFound."""
        check_queue_name(name)
        self._route(name, refresh=True)
        return Queue(self, name)

    def list_queues(self) -> list[str]:
        """The names of this account's queues (every queue for the ``default`` account)."""
        return call(lambda: self._request(self._manager.list_queues, "", "list_queues"))

    def delete_queue(self, name: str) -> None:
        """Delete a queue, its dead-letter queue and all their messages."""
        check_queue_name(name)
        call(lambda: self._request(self._manager.delete_queue, name, "delete_queue", name))
        self._routes.pop(name, None)

    def stats(self) -> list:
        """Every shard's statistics."""
        return [call(lambda s=s: self._request(s.stats, "", "stats")) for s in self._shards]

    # -- tasks ------------------------------------------------------------------
    def register(self, fn: TaskFunction) -> None:
        """Register a ``@rayq.task`` handler with the runtime (``submit`` does it on first use).
        The runtime keeps it: consumers find it again after a restart."""
        if not isinstance(fn, TaskFunction):
            raise InvalidMessage(f"submit and register take a @rayq.task function, not {fn!r}")
        handler = cloudpickle.dumps(fn.fn)
        if self._registered.get(fn.spec.type) == (fn.spec, handler):
            return
        call(lambda: self._request(self._manager.register_task, fn.spec.queue, "register_task",
                                   fn.spec, handler))
        self._registered[fn.spec.type] = (fn.spec, handler)

    def submit(self, fn: TaskFunction, *args: Any, tenant: str | None = None, delay_s: float = 0,
               **kwargs: Any) -> ray.ObjectRef:
        """Enqueue a call of a ``@rayq.task`` durably; returns a ``ray.ObjectRef``.

        ``ray.get`` on it gives the handler's return value, or raises an error
        that is a :class:`rayq.TaskError` carrying the handler's exception type
        and message (also when the task ended in the dead-letter queue).
        Arguments and the result must be msgpack-able values. ``tenant`` defaults to
        this client's account (a signed client submits only as its own account).
        """
        self.register(fn)
        spec = fn.spec
        store = self.config.store
        tenant = self.account if tenant is None else tenant
        check_name(tenant, "tenant")
        check_seconds(delay_s, "delay_s", 0, store.max_delay_s)
        body = encode_call(spec.type, args, kwargs, store.max_message_bytes)
        message = NewMessage(body, tenant, spec.type,
                             fairness_key(tenant, spec.type, self.config.fairness.key),
                             float(delay_s), task=True)
        [(message_id, shard)] = Queue(self, spec.queue)._put([message])
        return self._shards[shard].wait_outcome.remote(message_id)

    # -- fairness ----------------------------------------------------------------
    def _coordinator(self):
        return named(COORDINATOR)

    def fairness(self) -> FairnessReport:
        """Intervention state, victims, offenders, starvation per key, listen order,
        permits, suspension rules and recent decisions (see rayq.FairnessReport)."""
        return call(lambda: self._request(self._coordinator().report, "", "fairness"))

    def suspend(self, key: str, reason: str, by: str) -> SuspensionRule:
        """Stop dispatching fairness key ``key``; the rule keeps who, when and why."""
        return call(lambda: self._request(self._coordinator().suspend, "", "suspend", key, reason, by))

    def resume(self, key: str, by: str = "unknown") -> SuspensionRule | None:
        """Lift the suspension of ``key`` (its history stays); None if it was not suspended."""
        return call(lambda: self._request(self._coordinator().resume, "", "resume", key, by))

    # -- flooders ----------------------------------------------------------------
    def flooders(self) -> list[Flooder]:
        """The flooder list: queue, type, tenant ("*" for a whole type), since, spilled."""
        return call(lambda: self._request(named(FLOOD_DETECTOR).flooders_now, "", "flooders"))

    def flood_events(self) -> tuple[dict, ...]:
        """Recent detections, isolations, sweep batches, pauses and removals, oldest first."""
        return call(lambda: self._request(named(FLOOD_DETECTOR).events, "", "flood_events"))

    # -- analytics ---------------------------------------------------------------
    def flush_events(self) -> int:
        """Write every runtime actor's buffered events to the event log now."""
        handles = self._shards + [named(name) for name in (COORDINATOR, FLOOD_DETECTOR)]
        refs = [self._request(h.flush_events, "", "flush_events") for h in handles]
        ray.wait(refs, num_returns=len(refs))  # every answer in, before any error is raised
        return sum(call(lambda ref=ref: ref) for ref in refs)

    def report(self, out_dir: str | os.PathLike, progress=None) -> Report:
        """Flush pending events, then run the Spark report (RayDP, on this Ray cluster)
        over the event log. Returns a rayq.Report: ``html`` is the page's path, ``tables``
        maps table names to Parquet paths. ``progress(step)`` hears each step."""
        from rayq.analytics.report import current_thresholds, run_report

        self.flush_events()
        data_dir = call(lambda: self._request(self._manager.info, "", "info"))["data_dir"]
        return run_report(os.path.join(data_dir, "events"), os.path.abspath(out_dir),
                          self.config.analytics, progress or (lambda step: None),
                          current_thresholds(self.config))

    def scale_consumers(self, count: int) -> int:
        """Run ``count`` consumer actors from now on (kept across restarts); returns it.
        On a cluster with an autoscaler, room for them is requested too."""
        check_count(count, "consumers", 0, 1000)
        return call(lambda: self._request(self._manager.scale_consumers, "", "scale_consumers",
                                          count))

    def consumer_stats(self) -> list:
        """Every running consumer's :class:`~actors.consumer.ConsumerStats`."""
        from actors.consumer import named_consumers

        refs = [h.stats.remote() for h in named_consumers().values()]
        out = []
        for ref in refs:
            try:
                out.append(call(lambda ref=ref: ref))
            except RuntimeFailure:
                pass  # a consumer stopping right now
        return sorted(out, key=lambda s: s.index)

    def task_stats(self, by: str | None = None) -> list[TallyRow]:
        """Finished tasks since the runtime started: outcomes, usage, wait p50/p99, per
        (tenant, type), or per tenant (``by="tenant"``) or per type (``by="type"``).
        Counted by the coordinator from every consumer's reports."""
        return call(lambda: self._request(self._coordinator().task_stats, "", "task_stats", by))

    # -- routing ----------------------------------------------------------------
    def _route(self, name: str, refresh: bool = False) -> tuple[QueueInfo, list[int], int]:
        """(queue, receive order, this session's put subqueue), cached for ROUTE_TTL_S."""
        cached = self._routes.get(name)
        now = time.monotonic()
        if cached and not refresh and now - cached[0] < ROUTE_TTL_S:
            return cached[1:]
        queue, order, target = call(lambda: self._request(self._manager.routing, name, "routing",
                                                          name))
        if cached:  # enqueuer affinity: keep our subqueue while it takes puts
            mine = queue.subqueue(cached[3])
            if mine is not None and mine.state is SubqueueState.ALL:
                target = mine.id
        self._routes[name] = (now, queue, order, target)
        return queue, order, target

    def _shard_of(self, queue: QueueInfo, sq: int):
        return self._shards[queue.subqueue(sq).shard]
