"""Client and Queue: the user-facing facades over the runtime's actor handles.

The data path goes straight from the client to the shard actors; the manager
is asked only for routing (cached for a moment) and queue administration.
A client is one producer session: its puts to a queue stick to one subqueue
(enqueuer affinity, seed 004) so they stay in order.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import cloudpickle

from actors import COORDINATOR, FLOOD_DETECTOR, NAMESPACE

from rayq.analytics.report import Report
from rayq.config import Config
from rayq.core.auth import ADMIN, Signature, Signer
from rayq.core.model import (NewMessage, Outgoing, Receipt, Received, SubqueueState, check_count,
                             check_name, check_seconds, encode_body, fairness_key)
from rayq.core.fairness import FairnessReport
from rayq.core.flood import Flooder
from rayq.core.registry import QueueInfo, check_queue_name
from rayq.core.rules import SuspensionRule
from rayq.core.tasks import TallyRow, TaskFunction, encode_call
from rayq.errors import InvalidMessage, QueueDisabled, RayqError, ReceiptInvalid, RuntimeFailure
from rayq.sending import sender_for

ROUTE_TTL_S = 2.0
MAX_WAIT_S = 20.0
MAX_RECEIVE = 1000
_RETRY_ERRORS = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
_RETRY_FOR_S = 60.0


def call(make_ref: Callable[[], Any]) -> Any:
    """``ray.get`` a remote call, re-raising rayq errors as themselves.

    A call that meets a restarting actor is issued again until it answers
    (shards restart by themselves and lose nothing they acknowledged).
    """
    deadline = time.monotonic() + _RETRY_FOR_S
    delay = 0.05
    while True:
        try:
            return ray.get(make_ref())
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, RayqError):
                raise err.cause from None
            raise RuntimeFailure(f"runtime call failed: {err}") from err
        except _RETRY_ERRORS as err:
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"runtime actor unavailable: {err}") from err
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


@dataclass(frozen=True)
class KeyStats:
    depth: int
    oldest_age_s: float


@dataclass(frozen=True)
class QueueStats:
    """A queue's depth (approximate), per-key depth and oldest age, subqueues and shard caches."""

    name: str
    depth: int
    dead_letter_depth: int
    subqueues: tuple[dict, ...]
    keys: dict[str, KeyStats] = field(default_factory=dict)
    shards: tuple[dict, ...] = ()


def _named(name: str):
    """A runtime actor by name. Raises RuntimeFailure when it is not running."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError as err:
        raise RuntimeFailure(f"the runtime actor {name!r} is not running") from err


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

    def whoami(self) -> str:
        """The account the runtime sees this client as (checks the credentials)."""
        return call(lambda: self._manager.whoami.remote(auth=self._auth("", "whoami")))

    def create_account(self, name: str) -> str:
        """Create account ``name`` (``default`` account only); returns its primary key.
        Hand it to the account's owner: ``rayq.connect(account=name, key=key)``."""
        return call(lambda: self._manager.create_account.remote(
            name, auth=self._auth("", "create_account", name)))

    def rotate_key(self, slot: int = 1, account: str | None = None) -> str:
        """Replace key ``slot`` (1 or 2) of ``account`` (``default`` account only; default:
        this client's own); returns the new key. The other slot's key keeps working, so
        clients move over one slot at a time; the replaced key is refused from now on."""
        account = self.account if account is None else account
        return call(lambda: self._manager.rotate_key.remote(
            account, slot, auth=self._auth("", "rotate_key", account, slot)))

    # -- administration ------------------------------------------------------
    def create_queue(self, name: str, subqueues: int = 1, max_receives: int | None = 5) -> "Queue":
        """Create a queue and its ``<name>-dlq`` (idempotent); returns the queue. It belongs
        to this client's account; a name another account owns raises AuthError."""
        check_queue_name(name)
        call(lambda: self._manager.create_queue.remote(
            name, subqueues, max_receives,
            auth=self._auth(name, "create_queue", name, subqueues, max_receives)))
        self._routes.pop(name, None)
        return Queue(self, name)

    def queue(self, name: str) -> "Queue":
        """The queue called ``name``. Raises QueueNotFound."""
        check_queue_name(name)
        self._route(name, refresh=True)
        return Queue(self, name)

    def list_queues(self) -> list[str]:
        """The names of this account's queues (every queue for the ``default`` account)."""
        return call(lambda: self._manager.list_queues.remote(auth=self._auth("", "list_queues")))

    def delete_queue(self, name: str) -> None:
        """Delete a queue, its dead-letter queue and all their messages."""
        check_queue_name(name)
        call(lambda: self._manager.delete_queue.remote(
            name, auth=self._auth(name, "delete_queue", name)))
        self._routes.pop(name, None)

    def stats(self) -> list:
        """Every shard's statistics."""
        return [call(lambda s=s: s.stats.remote(auth=self._auth("", "stats"))) for s in self._shards]

    # -- tasks ------------------------------------------------------------------
    def register(self, fn: TaskFunction) -> None:
        """Register a ``@rayq.task`` handler with the runtime (``submit`` does it on first use).
        The runtime keeps it: consumers find it again after a restart."""
        if not isinstance(fn, TaskFunction):
            raise InvalidMessage(f"submit and register take a @rayq.task function, not {fn!r}")
        handler = cloudpickle.dumps(fn.fn)
        if self._registered.get(fn.spec.type) == (fn.spec, handler):
            return
        call(lambda: self._manager.register_task.remote(
            fn.spec, handler, auth=self._auth(fn.spec.queue, "register_task", fn.spec, handler)))
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
        return _named(COORDINATOR)

    def fairness(self) -> FairnessReport:
        """Intervention state, victims, offenders, starvation per key, listen order,
        permits, suspension rules and recent decisions (see rayq.FairnessReport)."""
        return call(lambda: self._coordinator().report.remote(auth=self._auth("", "fairness")))

    def suspend(self, key: str, reason: str, by: str) -> SuspensionRule:
        """Stop dispatching fairness key ``key``; the rule keeps who, when and why."""
        return call(lambda: self._coordinator().suspend.remote(
            key, reason, by, auth=self._auth("", "suspend", key, reason, by)))

    def resume(self, key: str, by: str = "unknown") -> SuspensionRule | None:
        """Lift the suspension of ``key`` (its history stays); None if it was not suspended."""
        return call(lambda: self._coordinator().resume.remote(
            key, by, auth=self._auth("", "resume", key, by)))

    # -- flooders ----------------------------------------------------------------
    def flooders(self) -> list[Flooder]:
        """The flooder list: queue, type, tenant ("*" for a whole type), since, spilled."""
        return call(lambda: _named(FLOOD_DETECTOR).flooders_now.remote(
            auth=self._auth("", "flooders")))

    def flood_events(self) -> tuple[dict, ...]:
        """Recent detections, isolations, sweep batches, pauses and removals, oldest first."""
        return call(lambda: _named(FLOOD_DETECTOR).events.remote(
            auth=self._auth("", "flood_events")))

    # -- analytics ---------------------------------------------------------------
    def flush_events(self) -> int:
        """Write every runtime actor's buffered events to the event log now."""
        handles = self._shards + [_named(name) for name in (COORDINATOR, FLOOD_DETECTOR)]
        refs = [h.flush_events.remote(auth=self._auth("", "flush_events")) for h in handles]
        ray.wait(refs, num_returns=len(refs))  # every answer in, before any error is raised
        return sum(call(lambda ref=ref: ref) for ref in refs)

    def report(self, out_dir: str | os.PathLike, progress=None) -> Report:
        """Flush pending events, then run the Spark report (RayDP, on this Ray cluster)
        over the event log. Returns a rayq.Report: ``html`` is the page's path, ``tables``
        maps table names to Parquet paths. ``progress(step)`` hears each step."""
        from rayq.analytics.report import run_report

        self.flush_events()
        data_dir = call(lambda: self._manager.info.remote(auth=self._auth("", "info")))["data_dir"]
        return run_report(os.path.join(data_dir, "events"), os.path.abspath(out_dir),
                          self.config.analytics, progress or (lambda step: None))

    def scale_consumers(self, count: int) -> int:
        """Run ``count`` consumer actors from now on (kept across restarts); returns it.
        On a cluster with an autoscaler, room for them is requested too."""
        check_count(count, "consumers", 0, 1000)
        return call(lambda: self._manager.scale_consumers.remote(
            count, auth=self._auth("", "scale_consumers", count)))

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
        return call(lambda: self._coordinator().task_stats.remote(
            by, auth=self._auth("", "task_stats", by)))

    # -- routing ----------------------------------------------------------------
    def _route(self, name: str, refresh: bool = False) -> tuple[QueueInfo, list[int], int]:
        """(queue, receive order, this session's put subqueue), cached for ROUTE_TTL_S."""
        cached = self._routes.get(name)
        now = time.monotonic()
        if cached and not refresh and now - cached[0] < ROUTE_TTL_S:
            return cached[1:]
        queue, order, target = call(lambda: self._manager.routing.remote(
            name, auth=self._auth(name, "routing", name)))
        if cached:  # enqueuer affinity: keep our subqueue while it takes puts
            mine = queue.subqueue(cached[3])
            if mine is not None and mine.state is SubqueueState.ALL:
                target = mine.id
        self._routes[name] = (now, queue, order, target)
        return queue, order, target

    def _shard_of(self, queue: QueueInfo, sq: int):
        return self._shards[queue.subqueue(sq).shard]


class Queue:
    """One virtual queue. All methods are blocking calls to the runtime."""

    def __init__(self, client: Client, name: str):
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- sending -------------------------------------------------------------------
    def _message(self, body: Any, tenant: str | None, type: str, delay_s: float,
                 ttl_s: float | None) -> NewMessage:
        store = self._client.config.store
        tenant = self._client.account if tenant is None else tenant
        check_name(tenant, "tenant"), check_name(type, "type")
        check_seconds(delay_s, "delay_s", 0, store.max_delay_s)
        if ttl_s is not None:
            check_seconds(ttl_s, "ttl_s", 0.001, store.max_ttl_s)
        key = fairness_key(tenant, type, self._client.config.fairness.key)
        return NewMessage(encode_body(body, store.max_message_bytes), tenant, type, key,
                          float(delay_s), ttl_s)

    def send(self, body: Any, tenant: str | None = None, type: str = "default",
             delay_s: float = 0, ttl_s: float | None = None) -> str:
        """Store one message durably (fsync'd before this returns); returns its id.
        ``tenant`` defaults to the client's account (a signed client sends only as it)."""
        return self._put([self._message(body, tenant, type, delay_s, ttl_s)])[0][0]

    def send_batch(self, messages: Sequence[Outgoing]) -> list[str]:
        """Store up to 1000 messages in one durable transaction; returns their ids in order."""
        if not isinstance(messages, (list, tuple)) or not 1 <= len(messages) <= MAX_RECEIVE:
            raise InvalidMessage(f"send_batch takes a list of 1 to {MAX_RECEIVE} Outgoing")
        if not all(isinstance(m, Outgoing) for m in messages):
            raise InvalidMessage("send_batch takes rayq.Outgoing values")
        return [mid for mid, _ in self._put([
            self._message(m.body, m.tenant, m.type, m.delay_s, m.ttl_s) for m in messages])]

    def _put(self, messages: list[NewMessage]) -> list[tuple[str, int]]:
        """Put durably; (message id, shard index) per message."""
        runtime = self._client._manager._actor_id.hex()
        # one coalescer per account: a batch is signed by, and checked for, one account
        return sender_for((runtime, self._client.account), self.name, self._put_now).send(messages)

    def _put_now(self, messages: list[NewMessage]) -> list[tuple[str, int]]:
        for attempt in range(3):
            queue, _, target = self._client._route(self.name, refresh=attempt > 0)
            index = queue.subqueue(target).shard
            shard = self._client._shards[index]
            try:
                return [(mid, index) for mid in call(lambda: shard.put.remote(
                    target, messages, auth=self._client._auth(self.name, "put", target, messages)))]
            except QueueDisabled:
                continue  # the subqueue was retired: ask for another
        raise QueueDisabled(f"queue {self.name!r} accepts no messages")

    # -- receiving -------------------------------------------------------------------
    def receive(self, max_messages: int = 1, visibility_timeout_s: float = 30,
                wait_s: float = 0) -> list[Received]:
        """Hide and return up to ``max_messages`` messages, each with a pop receipt.

        ``wait_s`` (at most 20) long-polls: returns as soon as a message
        arrives, or empty after ``wait_s``.
        """
        check_count(max_messages, "max_messages", 1, MAX_RECEIVE)
        store = self._client.config.store
        check_seconds(visibility_timeout_s, "visibility_timeout_s", 0, store.max_visibility_timeout_s)
        check_seconds(wait_s, "wait_s", 0, MAX_WAIT_S)
        deadline = time.monotonic() + wait_s
        while True:
            got = self._receive_pass(max_messages, visibility_timeout_s, 0.0)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            got = self._receive_pass(max_messages, visibility_timeout_s, min(remaining, 1.0),
                                     first_only=True)
            if got:
                return got

    def _receive_pass(self, n: int, visibility_timeout_s: float, wait_s: float,
                      first_only: bool = False) -> list[Received]:
        queue, order, _ = self._client._route(self.name)
        out: list[Received] = []
        for sq in order[:1] if first_only else order:
            info = queue.subqueue(sq)
            shard = self._client._shards[info.shard]
            dead_letter = queue.dead_letter_on(info.shard) if queue.max_receives else None
            try:
                got = call(lambda: shard.receive.remote(
                    sq, n - len(out), visibility_timeout_s, max_receives=queue.max_receives,
                    dead_letter=dead_letter, wait_s=wait_s,
                    auth=self._client._auth(self.name, "receive", sq, n - len(out),
                                            visibility_timeout_s, None, queue.max_receives,
                                            dead_letter, wait_s, None)))
            except QueueDisabled:  # dropped since we routed (drained, retired): route anew
                self._client._route(self.name, refresh=True)
                continue
            out.extend(Received.from_stored(m) for m in got)
            if len(out) >= n:
                break
        return out

    def peek(self, max_messages: int = 1) -> list[Received]:
        """The next messages, without hiding them; their ``receipt`` is None."""
        check_count(max_messages, "max_messages", 1, MAX_RECEIVE)
        queue, order, _ = self._client._route(self.name)
        out: list[Received] = []
        for sq in order:
            shard = self._client._shard_of(queue, sq)
            want = max_messages - len(out)
            got = call(lambda: shard.peek.remote(
                sq, want, auth=self._client._auth(self.name, "peek", sq, want, None)))
            out.extend(Received.from_stored(m) for m in got)
            if len(out) >= max_messages:
                break
        return out

    # -- receipts ------------------------------------------------------------------------
    def _locate(self, receipt: Any) -> tuple[Any, str]:
        sq = Receipt.decode(receipt).subqueue
        queue, _, _ = self._client._route(self.name)
        if queue.subqueue(sq) is None:
            queue, _, _ = self._client._route(self.name, refresh=True)
        if queue.subqueue(sq) is None:
            raise ReceiptInvalid(f"receipt does not belong to queue {self.name!r}")
        return self._client._shard_of(queue, sq), receipt

    def delete(self, receipt: str) -> None:
        """Delete a received message. Raises ReceiptInvalid when the receipt is stale."""
        shard, receipt = self._locate(receipt)
        if call(lambda: shard.delete.remote(
                [receipt], auth=self._client._auth(self.name, "delete", [receipt]))):
            raise ReceiptInvalid("pop receipt is stale: the message was deleted, received "
                                 "again or had its visibility changed", (receipt,))

    def delete_batch(self, receipts: Sequence[str]) -> None:
        """Delete many messages. Valid receipts are honoured even when others are
        invalid; those raise one ReceiptInvalid listing them in ``receipts``."""
        if not isinstance(receipts, (list, tuple)) or len(receipts) > MAX_RECEIVE:
            raise InvalidMessage(f"delete_batch takes a list of at most {MAX_RECEIVE} receipts")
        by_shard, invalid = defaultdict(list), []
        for receipt in receipts:
            try:
                shard, _ = self._locate(receipt)
            except ReceiptInvalid:
                invalid.append(receipt)
                continue
            by_shard[shard].append(receipt)
        refs = [shard.delete.remote(batch, auth=self._client._auth(self.name, "delete", batch))
                for shard, batch in by_shard.items()]
        for ref in refs:
            invalid.extend(call(lambda ref=ref: ref))
        if invalid:
            raise ReceiptInvalid(f"{len(invalid)} of {len(receipts)} receipts were invalid",
                                 tuple(invalid))

    def change_visibility(self, receipt: str, timeout_s: float) -> str:
        """Hide a received message for ``timeout_s`` from now; returns the new receipt
        (the old one is invalid from then on)."""
        shard, receipt = self._locate(receipt)
        return call(lambda: shard.change_visibility.remote(
            receipt, timeout_s,
            auth=self._client._auth(self.name, "change_visibility", receipt, timeout_s)))

    # -- inspection ------------------------------------------------------------------------
    def _counts(self, queue: QueueInfo) -> dict[int, int]:
        by_shard = defaultdict(list)
        for sq in queue.subqueues:
            by_shard[sq.shard].append(sq.id)
        refs = [self._client._shards[shard].counts.remote(
                    ids, auth=self._client._auth(self.name, "counts", ids))
                for shard, ids in by_shard.items()]
        return {sq: n for ref in refs for sq, n in call(lambda ref=ref: ref).items()}

    def count(self) -> int:
        """Messages in the queue (visible, in flight and delayed): one call per shard."""
        queue, _, _ = self._client._route(self.name)
        return sum(self._counts(queue).values())

    def clear(self) -> None:
        """Delete every message of the queue (not of its dead-letter queue)."""
        queue, _, _ = self._client._route(self.name, refresh=True)
        for sq in queue.subqueues:
            call(lambda sq=sq: self._client._shards[sq.shard].clear.remote(
                sq.id, auth=self._client._auth(self.name, "clear", sq.id)))

    def stats(self) -> QueueStats:
        """Depth, per-key depth and oldest age, subqueues and (for the ``default`` account)
        their shards' cache counters."""
        queue, _, _ = self._client._route(self.name, refresh=True)
        counts = self._counts(queue)
        mine = {sq.id for sq in queue.subqueues}
        keys: dict[str, KeyStats] = {}
        shard_ids = sorted({sq.shard for sq in queue.subqueues})
        for shard in shard_ids:
            ids = sorted(sq.id for sq in queue.subqueues if sq.shard == shard)
            for d in call(lambda shard=shard, ids=ids: self._client._shards[shard].depths.remote(
                    ids, auth=self._client._auth(self.name, "depths", ids))):
                if d.subqueue in mine:
                    old = keys.get(d.key, KeyStats(0, 0.0))
                    keys[d.key] = KeyStats(old.depth + d.count, max(old.oldest_age_s, d.latency_s))
        try:
            dlq = self._client.queue(self.name + "-dlq").count() if not queue.is_dlq else 0
        except RayqError:
            dlq = 0
        subqueues = tuple({"id": s.id, "shard": s.shard, "state": s.state.value,
                           "version": s.version, "count": counts.get(s.id, 0)}
                          for s in queue.subqueues)
        shards = ()
        if self._client.account == ADMIN:  # shard caches hold every account's messages
            shards = tuple({"shard": st.index, **vars(st.store.cache)}
                           for st in (call(lambda s=s: self._client._shards[s].stats.remote(
                               auth=self._client._auth("", "stats")))
                                      for s in shard_ids))
        return QueueStats(self.name, sum(counts.values()), dlq, subqueues, keys, shards)
