"""Client: a session with a runtime: queue administration, tasks, accounts, fairness,
flooders and analytics. Queue operations are in :mod:`rayq.queue`; a client and
its queues reach the runtime through one :class:`~rayq.transport.Transport`
(actor handles, signer, route cache, producers), which clients connected with the
same credentials share."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray import cloudpickle

from rayq.names import COORDINATOR, FLOOD_DETECTOR

from rayq.analytics.report import Report
from rayq.config import MAX_CONSUMERS, Config
from rayq.core.auth.accounts import ADMIN, QUEUE_SEP, Signer
from rayq.core.auth.operations import COORDINATOR_OPS, FLOOD_OPS, MANAGER_OPS, SHARD_OPS
from rayq.core.auth.quotas import Quota
from rayq.core.codec.model import MAX_BATCH, check_count
from rayq.core.fairness.policy import FairnessReport
from rayq.core.flood.detection import Flooder
from rayq.core.control.control_places import drained
from rayq.core.control.registry import check_queue_ref
from rayq.core.fairness.rules import SuspensionRule
from rayq.core.codec.task_ids import TaskInfo, check_task_id, checked_task_ids, new_task_id
from rayq.core.storage.outcomes import CancelResult, FoundTask
from rayq.core.codec.tasks import encode_call, task_time_limit_s
from rayq.core.control.schedules import (MAX_CALL_BYTES, Cadence, Schedule,
                                         check_schedule_name)
from rayq.core.fairness.tallies import TallyRow
from rayq.tasks import TaskFunction
from rayq.errors import InvalidMessage, ResultTimeout, RuntimeFailure, TaskNotFound
from rayq.queue import Queue
from rayq import redriving
from rayq.remote import call, call_all, named
from rayq.transport import Transport

DRAIN_POLL_S = 0.5  # how often client.drain asks what the node still holds
REMEMBERED_REFS = 100_000  # refs whose task id a client tells (the latest ones)


class TaskBook:
    """Refs and ids of one client's tasks. A ref is the return of a ``wait`` call on the
    task's shard's outcome desk (``actors/outcomes.py``), which outlives the shard's
    leader changes. A task is found from its id alone by asking every shard for the
    caller's account's id (a task id names no shard: the caller may have chosen it)."""

    def __init__(self, transport):
        self.transport = transport
        self._desks: dict[int, Any] = {}
        self._ids: dict[bytes, str] = {}  # ref's object id -> task id, oldest first

    def desk(self, shard: int):
        """Shard ``shard``'s outcome desk, started if it does not run yet."""
        desk = self._desks.get(shard)
        if desk is None:
            from actors.outcomes import outcome_desk
            desk = self._desks[shard] = outcome_desk(shard, self.transport.config)
        return desk

    def refs(self, placed: Sequence[tuple[str, int]]) -> list[ray.ObjectRef]:
        """One ObjectRef per task, in order: one ``wait`` call per shard's desk with a
        return per task (a Ray call costs ~0.7 ms of CPU here; one per task was most of
        a tiny task's cost). The refs of one call resolve together, once its last task
        has ended; ``submit`` makes one call of its own, so its ref waits for no other."""
        by_shard: dict[int, list[int]] = {}
        for at, (_, shard) in enumerate(placed):
            by_shard.setdefault(shard, []).append(at)
        refs: list = [None] * len(placed)
        for shard, ats in by_shard.items():
            ids = [placed[at][0] for at in ats]
            got = self.desk(shard).wait.options(num_returns=len(ids)).remote(ids)
            for at, ref in zip(ats, [got] if len(ids) == 1 else got):
                refs[at] = ref
        return refs

    def remember(self, refs: list[ray.ObjectRef], task_ids: list[str]) -> None:
        ids = self._ids
        for ref, task_id in zip(refs, task_ids):
            ids[ref.binary()] = task_id
        for _ in range(len(ids) - REMEMBERED_REFS):
            del ids[next(iter(ids))]

    def task_id(self, ref: Any) -> str:
        found = self._ids.get(ref.binary()) if isinstance(ref, ray.ObjectRef) else None
        if found is None:
            raise TaskNotFound(f"{ref!r} is not the ref of a task this client submitted "
                               f"(it tells the ids of its latest {REMEMBERED_REFS})")
        return found

    def find(self, task_id: str) -> tuple[int, FoundTask]:
        """(shard index, the task) of this account's task ``task_id``. Raises TaskNotFound."""
        check_task_id(task_id)
        transport = self.transport
        asked = [transport.request(SHARD_OPS["tasks"], shard, [task_id])
                 for shard in transport.shards.refresh()]
        ray.wait(asked, num_returns=len(asked))  # every answer in, before any error is raised
        for index, ref in enumerate(asked):
            [found] = call(lambda ref=ref: ref)
            if found is not None:
                return index, found
        raise TaskNotFound(f"no task {task_id!r} of account {transport.account!r}: never "
                           f"submitted, or its outcome was kept its time and is gone")

    def cancel(self, task_id: str) -> bool:
        """Cancel this account's task ``task_id`` (see :meth:`Client.cancel`)."""
        shard, found = self.find(task_id)
        transport = self.transport
        done = transport.call(SHARD_OPS["cancel"], transport.shards[shard], task_id)
        if done is None:
            raise TaskNotFound(f"no task {task_id!r} of account {transport.account!r}")
        if done == CancelResult.RUNNING:
            tell_consumers(found.message_id)
        return done != CancelResult.ENDED

    def result(self, shard: int, message_id: str, timeout_s: float | None) -> Any:
        """The value of the task ``message_id`` on ``shard`` (its TaskError raised)."""
        try:
            return call(lambda: self.desk(shard).wait.remote([message_id]), timeout_s=timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            raise ResultTimeout(f"the task has not ended after {timeout_s}s") from err


def tell_consumers(message_id: str) -> None:
    """Ask every consumer to look now whether the task ``message_id`` it may run was
    cancelled (each asks the task's shard, which keeps the cancel: a consumer missed
    here learns of it from its next heartbeat). Not waited for."""
    from actors.consumer import named_consumers

    for handle in named_consumers().values():
        handle.look_for_cancel.remote(message_id)


class Client:
    """A session with a rayq runtime. Build it with ``rayq.start()`` or ``rayq.connect()``."""

    def __init__(self, manager, shards: Sequence, config: Config, signer: Signer | None = None,
                 *, transport: Transport | None = None):
        """``transport``: one to share with other clients of the same runtime and
        credentials (``rayq.connect``'s; made over these same arguments); by default the
        client makes its own."""
        self.transport = transport or Transport(manager, shards, config, signer)
        self.config = config
        self._registered: dict[str, tuple] = {}  # type -> (spec, pickled handler) sent
        self._tasks = TaskBook(self.transport)

    # -- accounts ------------------------------------------------------------
    @property
    def account(self) -> str:
        """The account this client acts for: its signer's, or ``default`` when unsigned."""
        return self.transport.account

    def _manager(self, method: str, *args: Any) -> Any:
        """The result of the manager's signed operation ``method``."""
        return self.transport.call(MANAGER_OPS[method], self.transport.manager, *args)

    def whoami(self) -> str:
        """The account the runtime sees this client as (checks the credentials)."""
        return self._manager("whoami")

    def create_account(self, name: str) -> str:
        """Create account ``name`` (``default`` account only); returns its primary key.
        Hand it to the account's owner: ``rayq.connect(account=name, key=key)``. The name
        (letters, digits, '_', '-', '.') is also the account's queue namespace."""
        return self._manager("create_account", name)

    def rotate_key(self, slot: int = 1, account: str | None = None) -> str:
        """Replace key ``slot`` (1 or 2) of ``account`` (``default`` account only; default:
        this client's own); returns the new key. The other slot's key keeps working, so
        clients move over one slot at a time; the replaced key is refused from now on."""
        account = self.account if account is None else account
        return self._manager("rotate_key", account, slot)

    def set_quota(self, account: str, *, queues: int | None = None,
                  messages: int | None = None, bytes: int | None = None) -> Quota:
        """Limit ``account`` (``default`` account only) to ``queues`` queues, and its queues
        to ``messages`` messages and ``bytes`` bytes of bodies; each None (the default) is
        unlimited, and the call replaces all three (until set, an account has the default
        quota, ``rayq.core.auth.quotas.DEFAULT_QUOTA``). Past a limit, ``create_queue`` and
        sends raise QuotaExceeded; shards check messages and bytes approximately
        (docs/security.md). Returns the quota now in force."""
        return self._manager("set_quota", account, queues, messages, bytes)

    # -- administration ------------------------------------------------------
    def create_queue(self, name: str, subqueues: int = 1, max_receives: int | None = 5, *,
                     ordered: bool = False) -> "Queue":
        """Create a queue and its ``<name>-dlq`` in this account's namespace (idempotent);
        returns the queue. Another account may have a queue of the same name: it is a
        different queue. The ``default`` account may create ``account/name``.
        ``ordered``: a FIFO queue (one subqueue): each fairness key delivers its messages
        in order, one batch at a time; it may be sent with a key of the sender's choice
        (an ``Outgoing.key``, e.g. an SQS message group)."""
        check_queue_ref(name)
        self._manager("create_queue", name, subqueues, max_receives, ordered)
        self.transport.forget_route(name)
        return Queue(self.transport, name)

    def queue(self, name: str) -> "Queue":
        """This account's queue called ``name`` (the ``default`` account reaches another
        account's as ``account/name``). Raises QueueNotFound, also for a queue of another
        account: no account learns another's queue names."""
        check_queue_ref(name)
        self.transport.route(name, refresh=True)
        return Queue(self.transport, name)

    def list_queues(self) -> list[str]:
        """The names of this account's queues. For the ``default`` account: every
        account's queues, its own by plain name and the others' as ``account/name``."""
        return self._manager("list_queues")

    def delete_queue(self, name: str) -> None:
        """Delete a queue, its dead-letter queue and all their messages."""
        check_queue_ref(name)
        self._manager("delete_queue", name)
        self.transport.forget_route(name)

    def stats(self) -> list:
        """Every shard's statistics (``default`` account only); each shard's ``queues``
        maps every account's queues on it, by unambiguous name, to their messages there."""
        return [self.transport.call(SHARD_OPS["stats"], s) for s in self.transport.shards.refresh()]

    # -- tasks ------------------------------------------------------------------
    def register(self, fn: TaskFunction) -> None:
        """Register a ``@rayq.task`` handler with the runtime (``submit`` does it on first use).
        The runtime keeps it: consumers find it again after a restart."""
        if not isinstance(fn, TaskFunction):
            raise InvalidMessage(f"submit and register take a @rayq.task function, not {fn!r}")
        if self._registered.get(fn.spec.type, (None, None))[0] is fn:
            return  # pickled and sent once per registration, not on every submit
        handler = cloudpickle.dumps(fn.fn)
        self._manager("register_task", fn.spec, handler)
        self._registered[fn.spec.type] = (fn, handler)

    def submit(self, fn: TaskFunction, *args: Any, tenant: str | None = None, delay_s: float = 0,
               task_id: str | None = None, priority: int = 0,
               time_limit_s: float | None = None, **kwargs: Any) -> ray.ObjectRef:
        """Enqueue a call of a ``@rayq.task`` durably; returns a ``ray.ObjectRef``.

        ``ray.get`` on it gives the handler's return value, or raises an error
        that is a :class:`rayq.TaskError` carrying the handler's exception type
        and message (also when the task ended in the dead-letter queue). The ref
        resolves through the runtime's failovers and leader moves.
        Arguments and the result are msgpack values, tuples, numpy arrays and scalars,
        pyarrow Tables and RecordBatches, pandas DataFrames, datetime, date, timedelta,
        Decimal and UUID, nested as you like; each comes back as the same type with the
        same value, never through pickle (arrays come back read-only). A
        ``ray.ObjectRef`` argument, at any depth, is read here (``ray.get``) and its
        value stored with the task, which then needs nothing of this process. Anything
        else is refused with InvalidMessage naming its type, before anything is stored;
        a call whose encoding is over ``StoreConfig.max_task_bytes`` (256 MiB) with
        MessageTooLarge (docs/tasks.md#values). ``tenant`` defaults to
        this client's account (a signed client submits only as its own account).
        ``task_id``: the task's id (default: a random one; ``task_id(ref)`` tells it).
        A task submitted again under its id while its outcome is kept is the same
        task: the new ref is to it, and nothing runs again. ``priority`` (0 to 9): among
        its fairness key's (tenant's, type's) ready tasks a higher one runs first; between
        keys, fairness decides.
        ``time_limit_s``: this call's time limit, at most its type's (InvalidMessage above
        it); a call past it fails with TaskTimedOut (docs/tasks.md, "Cancel and time limits").
        """
        [ref] = self.submit_many(fn, [args], tenant=tenant, delay_s=delay_s, kwargs=kwargs,
                                 task_ids=None if task_id is None else [task_id],
                                 priority=priority, time_limit_s=time_limit_s)
        return ref

    def submit_many(self, fn: TaskFunction, args_list: Sequence[Sequence[Any]], *,
                    tenant: str | None = None, delay_s: float = 0,
                    kwargs: dict[str, Any] | None = None,
                    task_ids: Sequence[str] | None = None,
                    priority: int = 0,
                    time_limit_s: float | None = None) -> list[ray.ObjectRef]:
        """Enqueue many calls of a ``@rayq.task`` in one durable put (up to 1000); one
        ``ray.ObjectRef`` per call, in order (see :meth:`submit`). ``kwargs`` go to every
        call; ``task_ids``, if given, one id per call; ``time_limit_s`` to every call."""
        self.register(fn)
        if not isinstance(args_list, (list, tuple)) or not 1 <= len(args_list) <= MAX_BATCH:
            raise InvalidMessage(f"submit_many takes a list of 1 to {MAX_BATCH} argument tuples")
        chosen = task_ids is not None
        ids = checked_task_ids(task_ids, len(args_list)) if chosen \
            else [new_task_id() for _ in args_list]
        spec = fn.spec
        lowered_s = task_time_limit_s(spec, time_limit_s) if time_limit_s is not None else None
        # Task queues are the default account's: named so from every account.
        producer = self.transport.producer(ADMIN + QUEUE_SEP + spec.queue)
        attrs = producer.attrs(tenant, spec.type, delay_s, None, task=True, priority=priority)
        if not all(isinstance(args, (list, tuple)) for args in args_list):
            raise InvalidMessage("submit_many takes a list of argument tuples")
        entries = [(attrs, encode_call(spec.type, tuple(args), kwargs or {},
                                       self.config.store.max_task_bytes, task_id,
                                       lowered_s, _read_ref), task_id)
                   for args, task_id in zip(args_list, ids)]
        placed = producer.put_spread(entries) if chosen else producer.put(entries)
        refs = self._tasks.refs(placed)
        self._tasks.remember(refs, ids)
        return refs

    # -- tasks by id --------------------------------------------------------------
    def task_id(self, ref: ray.ObjectRef) -> str:
        """The id of the task ``ref`` waits on (a ref this process's client got from
        ``submit``, ``submit_many`` or ``ref``; the latest REMEMBERED_REFS of them).
        Raises TaskNotFound for any other ref."""
        return self._tasks.task_id(ref)

    def task(self, task_id: str) -> TaskInfo:
        """What task ``task_id`` of this client's account is doing: type, tenant, state
        (queued, running, succeeded, failed, cancelled), deliveries and times. Raises
        TaskNotFound for an id this account has no task under (or whose outcome expired)."""
        return self._tasks.find(task_id)[1].info

    def result(self, task_id: str, timeout_s: float | None = None) -> Any:
        """Task ``task_id``'s value, waiting up to ``timeout_s`` (None: until it ends).
        Raises its TaskError when it failed, ResultTimeout when the time ran out first,
        TaskNotFound as :meth:`task` does."""
        shard, found = self._tasks.find(task_id)
        return self._tasks.result(shard, found.message_id, timeout_s)

    def cancel(self, task_id: str) -> bool:
        """Cancel task ``task_id`` of this client's account; False when it had ended
        already. One that no consumer runs (queued, delayed, waiting for a retry) ends at
        once and never runs; a running one's handler is told (``rayq.current_task()
        .cancelled``; an async handler's coroutine is cancelled) and stopped if it has not
        returned after its type's ``cancel_grace_s``. Either way it ends cancelled (its ref
        and :meth:`result` raise TaskCancelled; its state is "cancelled"), is not retried
        and counts as no failure. Raises TaskNotFound as :meth:`task` does."""
        return self._tasks.cancel(task_id)

    def ref(self, task_id: str) -> ray.ObjectRef:
        """A new ``ray.ObjectRef`` of task ``task_id`` (as ``submit`` returned), from any
        process with this account's credentials. Raises TaskNotFound as :meth:`task` does."""
        shard, found = self._tasks.find(task_id)
        [ref] = self._tasks.refs([(found.message_id, shard)])
        self._tasks.remember([ref], [task_id])
        return ref

    # -- dead letters --------------------------------------------------------------
    def redrive(self, type_or_queue: TaskFunction | str, max_messages: int | None = None) -> int:
        """Move dead letters back, visible at once with their receive count reset; returns
        how many moved. A ``@rayq.task`` function (or, for the ``default`` account, the
        name of a registered type) moves that type's dead-lettered tasks from its queue's
        ``-dlq`` back to its queue, and each runs again under its id; any other name is a
        queue of this account (``account/name`` for the ``default`` account) whose
        ``<name>-dlq`` moves back to it. Up to ``max_messages`` (None: all there when the
        redrive reaches their shard). Raises QueueNotFound, TaskNotFound for a type not
        registered, QueueDisabled for a disabled queue, InvalidMessage, AuthError for a
        type redrive by another account (docs/tasks.md, "Redrive")."""
        name, type_ = redriving.source_of(type_or_queue, self.account,
                                          redriving.find_spec(self.transport))
        return redriving.redrive(self.transport, name, type_, max_messages)

    # -- schedules ----------------------------------------------------------------
    def schedule(self, name: str, fn: TaskFunction, *args: Any, every_s: float | None = None,
                 cron: str | None = None, tenant: str | None = None, **kwargs: Any) -> Schedule:
        """Submit ``fn(*args, **kwargs)`` every ``every_s`` seconds, or at the times of
        ``cron`` (five fields, read in UTC); exactly one of the two. The runtime keeps the
        schedule, per account, and submits each tick's call once, under the task id
        ``name@<tick, UTC>`` (docs/tasks.md, "Schedules"); ticks missed while it was down
        fire once on its return. Scheduling again under ``name`` replaces the schedule.
        ``tenant`` defaults to this client's account. Returns the rayq.Schedule. Raises
        InvalidMessage for a bad name, cadence or arguments (they are encoded now)."""
        check_schedule_name(name)
        Cadence(every_s, cron)  # checked before the handler is registered
        if not isinstance(fn, TaskFunction):
            raise InvalidMessage(f"schedule takes a @rayq.task function, not {fn!r:.80}")
        call = encode_call(fn.spec.type, args, kwargs,
                           min(MAX_CALL_BYTES, self.config.store.max_message_bytes))
        self.register(fn)
        return self._manager("schedule", name, fn.spec.type, call, every_s, cron, tenant)

    def schedules(self) -> list[Schedule]:
        """This account's schedules, by name, each with its next tick (``next_at``)."""
        return self._manager("schedules")

    def unschedule(self, name: str) -> bool:
        """Remove this account's schedule ``name`` (no tick fires from now on); whether
        there was one."""
        check_schedule_name(name)
        return self._manager("unschedule", name)

    # -- fairness ----------------------------------------------------------------
    def _coordinator(self, method: str, *args: Any) -> Any:
        """The result of the fairness coordinator's signed operation ``method``."""
        return self.transport.call(COORDINATOR_OPS[method], named(COORDINATOR), *args)

    def fairness(self) -> FairnessReport:
        """Intervention state, victims, offenders, starvation per key, listen order,
        permits, suspension rules and recent decisions (see rayq.FairnessReport)."""
        return self._coordinator("report")

    def suspend(self, key: str, reason: str, by: str) -> SuspensionRule:
        """Stop dispatching fairness key ``key``; the rule keeps who, when and why."""
        return self._coordinator("suspend", key, reason, by)

    def resume(self, key: str, by: str = "unknown") -> SuspensionRule | None:
        """Lift the suspension of ``key`` (its history stays); None if it was not suspended."""
        return self._coordinator("resume", key, by)

    def set_intervention(self, mode: str | None = None, *, node: str | None = None,
                         enabled: bool | None = None, by: str = "unknown"):
        """Fairness interventions "active" or "passive" for the whole runtime (``mode``:
        passive evaluates and records each decision, marked passive, and changes no
        listen order and starts no booster), or on or off on one ``node`` (``enabled``;
        its Ray node id, IP address or data-node label): consumers on a node where it is
        off ignore the plan. Returns the settings now in force
        (rayq.core.fairness.intervention.InterventionSettings). Raises InvalidMessage
        for a bad or mixed change."""
        return self._coordinator("set_intervention", mode, node, enabled, by)

    # -- flooders ----------------------------------------------------------------
    def flooders(self) -> list[Flooder]:
        """The flooder list: queue, type, tenant ("*" for a whole type), since, spilled."""
        return self.transport.call(FLOOD_OPS["flooders_now"], named(FLOOD_DETECTOR))

    def flood_events(self) -> tuple[dict, ...]:
        """Recent detections, isolations, sweep batches, pauses and removals, oldest first."""
        return self.transport.call(FLOOD_OPS["events"], named(FLOOD_DETECTOR))

    # -- analytics ---------------------------------------------------------------
    def flush_events(self) -> int:
        """Write every runtime actor's buffered events to the event log now."""
        flushes = [*((SHARD_OPS["flush_events"], s) for s in self.transport.shards.refresh()),
                   (COORDINATOR_OPS["flush_events"], named(COORDINATOR)),
                   (FLOOD_OPS["flush_events"], named(FLOOD_DETECTOR))]
        # a shard whose leader moved (a drain, a failover) is asked again where it is now
        return sum(call_all([lambda op=op, handle=handle: self.transport.request(op, handle)
                             for op, handle in flushes]))

    def report(self, out_dir: str | os.PathLike, progress=None) -> Report:
        """Flush pending events, then run the Spark report over every data node's event
        log in the runtime's analytics actor, whose Spark (RayDP, on this Ray cluster)
        stays warm between reports. The page and tables are written under ``out_dir``
        on this machine. Returns a rayq.Report: ``html`` is the page's path, ``tables``
        maps table names to Parquet paths. ``progress(step)`` hears each step."""
        from actors import analytics
        from rayq.analytics.report import current_thresholds

        self.flush_events()
        data_root = self._manager("info")["data_root"]
        return analytics.report(self.config, data_root, progress or (lambda step: None),
                                current_thresholds(self.config)).write(out_dir)

    def drain(self, node: str, wait_s: float | None = 600.0) -> dict[str, dict[str, int]]:
        """Move every shard copy, shard leadership and control store copy off data node
        ``node`` (admin only), so that removing it afterwards costs no failover and no
        seeding; nothing new goes there meanwhile. Waits up to ``wait_s`` (None: returns
        at once) and returns what the node still holds (all zeros: done). Raises
        RuntimeFailure when the time runs out first."""
        left = self._manager("drain", node)
        if wait_s is None:
            return left
        deadline = time.monotonic() + wait_s
        while not drained(left):
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"data node {node!r} still holds {left} after {wait_s}s")
            time.sleep(DRAIN_POLL_S)
            left = self._manager("drain_status", node)
        return left

    def undrain(self, node: str) -> None:
        """Data node ``node`` takes copies again (a drain called off)."""
        self._manager("undrain", node)

    def scale_consumers(self, count: int | None) -> int:
        """Run ``count`` consumer actors from now on, pinned: kept across restarts, and
        left alone by the backlog rule of ``ConsumerConfig(min_count=, max_count=)``;
        None hands the count back to the configuration (docs/autoscaling.md). Returns the
        count wanted now. On a cluster with an autoscaler, room for them is requested too."""
        if count is not None:
            check_count(count, "consumers", 0, MAX_CONSUMERS)
        return self._manager("scale_consumers", count)

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
        return self._coordinator("task_stats", by)


def _read_ref(value: Any) -> Any:
    """An argument's value to store in its stead: an ObjectRef's, read now (so the task
    does not depend on its owner), or ``value`` itself. InvalidMessage when it cannot be
    read."""
    if not isinstance(value, ray.ObjectRef):
        return value
    try:
        return ray.get(value)
    except Exception as err:
        raise InvalidMessage(f"an ObjectRef argument could not be read: {err}") from err
