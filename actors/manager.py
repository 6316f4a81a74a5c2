"""QueueManager: the persisted queue and task registries, routing, scaling.

Clients ask it where to put and where to receive; the data path goes straight
to the shards. A background loop reads subqueue counts and load from the
shards and applies the scaling policy of :mod:`rayq.core.control.scaling`, and keeps
the wanted number of consumer actors alive (following the task backlog when
``ConsumerConfig`` sets bounds). It also holds the cluster-wide
concurrency leases of limited job types.
"""

from __future__ import annotations

import asyncio
import os

import ray

from rayq.names import COORDINATOR, FLOOD_DETECTOR, namespace, server_env, consumer_name
from actors.controlstore import drain_marks, every_place, given_up_node, set_drain_marks
from actors.data_nodes import data_nodes
from actors.replication.keeper import WATCH_INTERVAL_S, ReplicaKeeper
from actors.event_reads import unshipped_events
from rayq.core.control.control_places import control_left_on, drained
from rayq.core.control.placement import marked_to_drain, unmarked
from rayq.core.replication.shard_places import ShardPlace
from actors.consumer import ConsumerRemote, named_consumers
from actors.base import ControlActor
from rayq.config import MAX_CONSUMERS, Config
from rayq.core.auth.accounts import (ADMIN, QUEUE_SEP, Accounts, Place, Signer, queue_ref,
                                     resolve_ref, split_ref)
from rayq.core.auth.operations import MANAGER_OPS, SHARD_OPS
from rayq.core.kit.clock import Clock
from rayq.core.auth.gate import Caller, Directory, signed
from rayq.core.kit.kv import LmdbKV
from rayq.core.fairness.leases import ConcurrencyLeases
from rayq.core.auth.quotas import Quota, Quotas, check_queue_quota, quota_of
from rayq.core.control.managing import (check_may_create, check_task_spec, check_visible,
                                        concurrency_limits, consumers_to_change, ids_by_shard,
                                        is_registration, owned_queues, rooms_of, shard_depths,
                                        visible_names)
from rayq.core.codec.model import SubqueueState, check_count
from rayq.core.control.registry import (QueueInfo, QueueMetadata, QueueRegistry, check_queue_ref,
                                        flood_watched, metadata_of, put_states, put_target,
                                        receive_order)
from rayq.core.control.scaling import (ConsumerRule, ConsumerScale, OpRates, QuietTracker,
                                       chosen_scale, decide, loads_of, next_scale, restored_scale,
                                       task_backlog)
from rayq.core.codec.tasks import TaskSpec
from rayq.core.control.registry import TaskRegistry
from rayq.core.control.schedules import RETRY_S, Cadence, Planned, Schedule, ScheduleBook
from rayq.core.codec.wire import encode_put
from rayq.errors import AuthError, InvalidMessage, RayqError
from rayq.sending import spread_target
from rayq.remote import NO_RETRY, call_all_async, call_async, running

FORGET_TIMEOUT_S = 10.0
TICK_INTERVAL_S = 0.25  # how often due schedules are looked for (a dict scan when none)


class QueueManager(ControlActor):
    def __init__(self, data_dir: str, config: Config, clock: Clock | None = None,
                 data_root: str | None = None, start_copy=None):
        super().__init__("manager", data_dir, config, clock, directory=self._directory,
                         start_copy=start_copy)
        self.registry = QueueRegistry(self.kv, shards=config.store.shards, clock=self.clock)
        self.tasks = TaskRegistry(self.kv)
        self.accounts = Accounts(self.kv)
        self.quotas = Quotas(self.kv)
        self.leases = ConcurrencyLeases()
        self._consumers = Consumers(self.kv, config, self.clock)
        self._counts: dict[int, int] = {}
        # routing()'s nudges since the running count read began: kept over that read,
        # which may have missed the sessions they stand for
        self._nudged: dict[int, int] = {}
        # The last count as read (routing() nudges _counts) and when it began (wall
        # clock): what quota rooms publish.
        self._counted: tuple[dict[int, int], float] = ({}, 0.0)
        self._rates = OpRates()
        self._quiet = QuietTracker(config.scaling)
        self.scaling_events: list[dict] = []
        self._states_told = False  # whether the shards were told every queue's put states
        self._run_every(config.scaling.interval_s, "scaling", self._scale_round)
        # the shards' replicas: in-sync sets and failover (docs/replication.md)
        suspect = given_up_node("manager")
        self.replicas = ReplicaKeeper(self.kv, data_root or data_dir, config, self.clock,
                                      suspect=suspect)
        # after a failover, the shards led where the old manager was are checked at once
        self._run_every(WATCH_INTERVAL_S, "replicas", self.replicas.watch,
                        first_s=0.0 if suspect else None)
        self.shards.grow(max(self.replicas.places, default=-1) + 1)  # every shard recorded
        self._shards_started = False  # whether every recorded shard was seen running
        self.schedule_book = ScheduleBook(self.kv)
        # a firing round and the changes to schedules take turns: once unschedule
        # returns, no put of the schedule is under way
        self._firing = asyncio.Lock()
        self._run_every(TICK_INTERVAL_S, "schedules", self._fire_schedules)

    async def shrink_in_sync(self, shard: int, node: str, epoch: int) -> ShardPlace:
        """Take a follower out of ``shard``'s in-sync set, as its leader of ``epoch``
        asks (the follower failed); the new place. Raises StaleEpoch when that
        leader was replaced."""
        return await self.replicas.shrink(shard, node, epoch)

    async def rejoin_in_sync(self, shard: int, node: str, epoch: int) -> ShardPlace:
        """Put a seeded follower that caught up in ``shard``'s in-sync set, as its
        leader of ``epoch`` asks; the new place."""
        return await self.replicas.rejoin(shard, node, epoch)

    # -- draining data nodes (docs/replication.md) ---------------------------------------
    @signed(MANAGER_OPS["drain"])
    async def drain(self, node: str) -> dict[str, dict[str, int]]:
        """Move every shard copy, leadership and control store copy off data node
        ``node`` (admin only), in the background: nothing new goes there meanwhile.
        Returns what it still holds (:meth:`drain_status`)."""
        set_drain_marks(marked_to_drain(drain_marks(), node, data_nodes(self.config)))
        return await self.drain_status(node)

    @signed(MANAGER_OPS["undrain"])
    async def undrain(self, node: str) -> None:
        """``node`` takes copies again (admin only)."""
        set_drain_marks(unmarked(drain_marks(), node))

    @signed(MANAGER_OPS["drain_status"])
    async def drain_status(self, node: str) -> dict[str, dict[str, int]]:
        """What data node ``node`` still holds: ``{"shards": {"leads", "copies"},
        "control": {"leads", "copies"}, "events": {"files"}}``; all zeros once it can
        leave at no cost. Once it holds no store, its event files (which no one writes
        to any more) are copied to this node's folder: the report still counts them
        after the node leaves."""
        left = {"shards": self.replicas.left_on(node),
                "control": control_left_on(every_place(), node)}
        files = await unshipped_events(self.config, self.replicas.data_dir, node,
                                       os.path.join(self.data_dir, "events"), drained(left))
        return {**left, "events": {"files": files}}

    def places(self) -> dict[int, ShardPlace]:
        """Every shard's replicas, in-sync set and epoch."""
        return dict(self.replicas.places)

    # -- accounts --------------------------------------------------------------
    async def _directory(self) -> Directory:
        return self.directory()

    def directory(self) -> Directory:
        """(every account's keys, where every subqueue belongs): what gates verify with."""
        task_types: dict[str, set[str]] = {}  # the default account's queues, by plain name
        for spec, _ in self.tasks.all().values():
            task_types.setdefault(spec.queue, set()).add(spec.type)
        rooms = rooms_of(self.quotas.limiting_puts(), self.registry.all(), *self._counted)
        places = {sq.id: Place(q.ref, q.owner, sq.shard, q.ref in task_types,
                               frozenset(task_types.get(q.ref, ())), rooms.get(q.owner))
                  for q in self.registry.all() for sq in q.subqueues}
        return self.accounts.table(), places

    @signed(MANAGER_OPS["whoami"])
    async def whoami(self, *, caller: Caller) -> str:
        """The account a request acts for (``connect`` checks its credentials with it)."""
        return caller.account

    @signed(MANAGER_OPS["create_account"])
    async def create_account(self, name: str) -> str:
        """A new account (admin only); returns its primary key."""
        key = self.accounts.create(name)
        await self._forget_everywhere()
        return key

    @signed(MANAGER_OPS["rotate_key"])
    async def rotate_key(self, account: str, slot: int) -> str:
        """Replace key ``slot`` (1 or 2) of ``account`` (admin only, as regenerating a
        storage key is a management operation: a leaked key must not be able to replace
        the other one); the other key keeps working. Every gate forgets the old key
        before this returns."""
        key = self.accounts.rotate(account, slot)
        await self._forget_everywhere()
        return key

    @signed(MANAGER_OPS["set_quota"])
    async def set_quota(self, account: str, queues: int | None = None,
                        messages: int | None = None, bytes: int | None = None) -> Quota:
        """Replace ``account``'s quota (admin only; None: unlimited); every gate fetches
        it before this returns."""
        if not isinstance(account, str) or account not in self.accounts:
            raise InvalidMessage(f"no account named {account!r:.80}")
        quota = self.quotas.set(account, quota_of(queues, messages, bytes))
        await self._forget_everywhere()
        return quota

    async def _forget_everywhere(self) -> None:
        """Every gate drops its directory copy (accounts, keys or task queues changed)."""
        self.gate.forget()
        holders = list(self.shards) + list(running((COORDINATOR, FLOOD_DETECTOR)).values())
        # A holder that does not answer in time is restarting: it starts with no copy.
        await asyncio.wait([asyncio.ensure_future(call_async(lambda h=h: h.forget_keys.remote()))
                            for h in holders], timeout=FORGET_TIMEOUT_S)

    def _visible(self, account: str, name: str, *, owned: bool = False) -> QueueInfo:
        """The queue ``account`` means by ``name`` if it may see it: its own, any for the
        admin, or a task queue of the default account (to submit to, unless ``owned``).
        Anything else is QueueNotFound, worded as for a missing queue: no account learns
        which names another account uses."""
        check_queue_ref(name)
        return check_visible(account, name, self.registry.find(resolve_ref(account, name)),
                             self.tasks.queues(), owned=owned)

    # -- registry --------------------------------------------------------------
    @signed(MANAGER_OPS["create_queue"])
    async def create_queue(self, name: str, subqueues: int = 1, max_receives: int | None = 5,
                           ordered: bool = False, *, caller: Caller) -> QueueInfo:
        """Create queue ``name`` in the caller's namespace (the admin may name another
        account's as ``account/name``); idempotent. ``ordered``: a FIFO queue."""
        check_queue_ref(name)
        owner, bare = split_ref(caller.account, name)
        check_may_create(caller.account, owner, self.accounts)
        new = queue_ref(owner, bare) not in self.registry
        if new:
            owned = owned_queues(self.registry.all(), owner)
            check_queue_quota(owner, self.quotas.get(owner), owned)
        # Placement needs shard depths only for a queue that does not exist yet.
        depths = await self._shard_depths() if new else {}
        queue = self.registry.create(bare, subqueues=subqueues, max_receives=max_receives,
                                     shard_depths=depths, owner=owner, ordered=ordered)
        if queue.ordered:
            await self._apply_put_states(queue)
        return queue

    @signed(MANAGER_OPS["list_queues"])
    async def list_queues(self, *, caller: Caller) -> list[str]:
        """The caller's queues by plain name; for the admin every account's queues, its
        own plain and the others' as ``account/name``."""
        return visible_names(caller.account, self.registry.all(), self.registry.names())

    @signed(MANAGER_OPS["delete_queue"])
    async def delete_queue(self, name: str, *, caller: Caller) -> None:
        queue = self._visible(caller.account, name, owned=True)
        removed = self.registry.delete(queue.ref)  # and recorded for purging
        await self._purge(removed)

    @signed(MANAGER_OPS["clear_queue"])
    async def clear_queue(self, name: str, *, caller: Caller) -> None:
        """Empty a queue at once (not its DLQ): fresh subqueues take its place and the
        shards remove the old ones' messages, spilled ones too, in the background."""
        queue = self._visible(caller.account, name, owned=True)
        removed = self.registry.renew(queue.ref)
        if queue.shards_told:  # the fresh subqueues refuse puts too, or are ordered
            await self._apply_put_states(self.registry.get(queue.ref))
        await self._purge(removed)
    # -- metadata and state (docs/operations.md) ------------------------------------
    @signed(MANAGER_OPS["set_metadata"])
    async def set_metadata(self, name: str, metadata: dict, *, caller: Caller) -> None:
        """Replace the queue's user-defined metadata (string values)."""
        queue = self._visible(caller.account, name, owned=True)
        self.registry.set_metadata(queue.ref, metadata)

    @signed(MANAGER_OPS["queue_metadata"])
    async def queue_metadata(self, name: str, *, caller: Caller) -> QueueMetadata:
        """The queue's metadata, state and approximate message count."""
        queue = self._visible(caller.account, name, owned=True)
        return metadata_of(queue, self._counts, name)

    @signed(MANAGER_OPS["set_enabled"])
    async def set_enabled(self, name: str, enabled: bool, *, caller: Caller) -> None:
        """Disable the queue (its shards refuse puts; receives go on) or enable it again.
        Recorded first, then told to the shards: the scaling loop tells them again."""
        queue = self._visible(caller.account, name, owned=True)
        if not isinstance(enabled, bool):
            raise InvalidMessage("enabled is True or False")
        await self._apply_put_states(self.registry.set_disabled(queue.ref, not enabled))

    async def _apply_put_states(self, queue: QueueInfo) -> None:
        for sq, state in put_states(queue).items():
            await self._set_state(queue.subqueue(sq).shard, sq, state)
        for sq in queue.ordered_subqueues:  # told again after a restart
            await call_async(lambda: self.shards[sq.shard].set_ordered.remote(sq.id))

    async def _purge(self, subqueues: list) -> None:
        """Hand subqueues to their shards for removal (O(subqueues) here); what a shard
        did not take yet stays recorded and is handed over again by the scaling loop."""
        for shard, ids in ids_by_shard(subqueues).items():
            await call_async(lambda: self.shards[shard].purge.remote(ids))
            self.registry.purged(ids)

    @signed(MANAGER_OPS["routing"])
    async def routing(self, name: str, *, caller: Caller) -> tuple[QueueInfo, list[int], int]:
        """(queue, subqueue ids in receive order, the put subqueue for a new session) of
        the queue the caller means by ``name``."""
        queue = self._visible(caller.account, name)
        order = [s.id for s in receive_order(queue, self._counts)]
        target = put_target(queue, self._counts)
        self._counts[target.id] = self._counts.get(target.id, 0) + 1  # spread new sessions
        self._nudged[target.id] = self._nudged.get(target.id, 0) + 1
        return queue, order, target.id

    def receive_routing(self, ref: str) -> tuple[QueueInfo, list[int]]:
        """(queue, subqueue ids in receive order) for consumers (``ref``: a runtime-wide
        name, see QueueInfo.ref); no put session is opened."""
        queue = self.registry.get(ref)
        return queue, [s.id for s in receive_order(queue, self._counts)]

    # -- flooders ----------------------------------------------------------------
    def flood_layout(self) -> dict[str, QueueInfo]:
        """The queues the flood detector watches by runtime-wide name (acme's ``orders``
        is ``acme/orders``): see :func:`flood_watched`."""
        return flood_watched(self.registry.all())

    def add_dedicated(self, ref: str, shard: int, type_: str, tenant: str):
        """A subqueue on ``shard`` that isolates flooder (type, tenant) of queue ``ref``."""
        return self.registry.add_dedicated(ref, shard, type_, tenant)

    async def coalesce(self, ref: str, sq: int) -> None:
        """A removed flooder's dedicated subqueue drains like any retired subqueue."""
        queue = self.registry.coalesce(ref, sq)
        info = queue.subqueue(sq)
        await call_async(lambda: self.shards[info.shard].set_state.remote(
            sq, SubqueueState.NO_PUT.value))

    # -- tasks -------------------------------------------------------------------
    @signed(MANAGER_OPS["register_task"])
    async def register_task(self, spec: TaskSpec, handler: bytes, *, caller: Caller) -> int:
        """Register a job type's handler (and create its queue); returns the registry version.
        Handlers run inside the runtime, so only the admin registers them; another account
        may "register" a type that is registered already with the same spec (a no-op)."""
        check_task_spec(spec)
        known = self.tasks.all().get(spec.type, (None, None))[0]
        if not is_registration(caller.account, spec, known):
            return self.tasks.version
        if spec.queue not in self.registry:  # the default account's namespace
            await self.create_queue(spec.queue, max_receives=spec.max_receives)
        new_queue = spec.queue not in self.tasks.queues()
        version = self.tasks.register(spec, handler)
        if new_queue:
            await self._forget_everywhere()  # gates learn that accounts may submit there
        return version

    def task_table(self, known_version: int | None = None) -> tuple[int, dict | None]:
        """(version, {type: (spec, handler bytes)}); the table is None when unchanged."""
        if known_version == self.tasks.version:
            return self.tasks.version, None
        return self.tasks.version, self.tasks.all()

    def acquire(self, type_: str, lease_id: str, limit: int, ttl_s: float) -> bool:
        return self.leases.acquire(type_, lease_id, limit, ttl_s, self.clock.monotonic())

    def renew(self, type_: str, lease_id: str, ttl_s: float) -> bool:
        return self.leases.renew(type_, lease_id, ttl_s, self.clock.monotonic())

    def release(self, type_: str, lease_id: str) -> None:
        self.leases.release(type_, lease_id)

    # -- schedules (docs/tasks.md, "Schedules") -----------------------------------------
    @signed(MANAGER_OPS["schedule"])
    async def schedule(self, name: str, type: str, call: bytes, every_s: float | None = None,
                       cron: str | None = None, tenant: str | None = None, *,
                       caller: Caller) -> Schedule:
        """Make (or replace) the caller's schedule ``name``: a call of task type ``type``
        (``call``: its encoded arguments) every ``every_s`` seconds or at the times of
        ``cron`` (UTC), submitted as ``tenant``. Raises InvalidMessage, AuthError for
        another account's tenant."""
        cadence = Cadence(every_s, cron)
        if not isinstance(type, str) or self.tasks.get(type) is None:
            raise InvalidMessage(f"no task type {type!r:.80} is registered")
        async with self._firing:
            planned = Planned.made(caller.account, name, type, tenant, cadence, call,
                                   self.clock.now())
            return self.schedule_book.put(planned).view()

    @signed(MANAGER_OPS["schedules"])
    async def schedules(self, *, caller: Caller) -> list[Schedule]:
        """The caller's schedules, by name."""
        return [p.view() for p in self.schedule_book.of(caller.account)]

    @signed(MANAGER_OPS["unschedule"])
    async def unschedule(self, name: str, *, caller: Caller) -> bool:
        """Remove the caller's schedule ``name``; whether there was one. No put of it is
        under way when this returns."""
        async with self._firing:
            return self.schedule_book.remove(caller.account, name)

    async def _fire_schedules(self) -> None:
        """One tick round: submit the call of every due schedule under its tick's task id
        (one put per account and subqueue), then record the firings. A schedule whose
        put failed fires again after RETRY_S; the first failure is raised to be counted."""
        async with self._firing:
            await self._fire_due(self.clock.now())

    async def _fire_due(self, now: float) -> None:
        due = self.schedule_book.due(now)
        if not due:
            return
        self.schedule_book.firing(due)  # the fence: a replaced manager stops here
        done, failed, errors = [], [], []
        for (account, queue, sq), group in self._schedule_puts(due, failed, errors).items():
            try:
                await self._put_fired(account, queue, sq, group)
                done += group
            except (RayqError, ray.exceptions.RayError) as err:
                failed += group
                errors.append(err)
        self.schedule_book.fired(done, now)
        self.schedule_book.hold(failed, now + RETRY_S)
        if errors:
            raise errors[0]

    def _schedule_puts(self, due: list[Planned], failed: list,
                       errors: list) -> dict[tuple[str, QueueInfo, int], list[Planned]]:
        """``due`` grouped by account and the task subqueue each one's task id picks, as
        ``Producer.put_spread`` picks it; a schedule whose type or queue is gone, or
        refuses puts, goes to ``failed`` with its error."""
        groups: dict[tuple[str, QueueInfo, int], list[Planned]] = {}
        for p in due:
            spec = self.tasks.get(p.type)
            try:
                if spec is None:
                    raise InvalidMessage(f"schedule {p.name!r}: no task type {p.type!r}")
                queue = self.registry.get(spec.queue)
                target = put_target(queue, self._counts).id
            except RayqError as err:
                failed.append(p)
                errors.append(err)
                continue
            sq = spread_target(queue, target, p.task_id)
            groups.setdefault((p.account, queue, sq), []).append(p)
        return groups

    async def _put_fired(self, account: str, queue: QueueInfo, sq: int,
                         group: list[Planned]) -> None:
        """Put the due tasks of ``group`` to subqueue ``sq`` of task queue ``queue`` as
        ``account``: signed with its key, as its own submits are (unsigned for the
        admin)."""
        batch = encode_put([p.entry(self.config.fairness.key) for p in group])
        shard, signed_for = self.shards[queue.subqueue(sq).shard], ADMIN + QUEUE_SEP + queue.name
        # signed anew on each try: a retry is no replay
        await call_async(lambda: shard.put.remote(sq, batch, auth=self._signed_as(
            account, SHARD_OPS["put"], sq, batch, queue=signed_for)))

    def _signed_as(self, account: str, operation, *args, queue: str):
        """A signature of ``operation`` over ``args`` made with ``account``'s first key
        (None for the admin: the runtime's own calls are unsigned)."""
        if account == ADMIN:
            return None
        keys = self.accounts.keys(account)
        if not keys:
            raise AuthError(f"account {account!r} has no key to sign with")
        return Signer(account, keys[0]).sign(operation, *args, queue=queue)

    # -- consumers -----------------------------------------------------------------
    @signed(MANAGER_OPS["scale_consumers"])
    async def scale_consumers(self, count: int | None = None) -> int:
        """Run ``count`` consumer actors from now on, pinned: the backlog rule leaves
        the count alone, across restarts. None hands the count back to the rule
        (a fixed configuration keeps the persisted or configured count). Returns the
        count wanted now."""
        return await self._consumers.scale(count)

    def consumer_count(self) -> int:
        """Regular consumers (boosters added for permits come on top)."""
        return self._consumers.wanted

    async def set_boost(self, extra: int) -> int:
        """Run ``extra`` booster consumers on top of the regular ones (fairness permits)."""
        return await self._consumers.set_boost(extra)

    def fairness_inputs(self) -> tuple[dict[str, int], dict[int, list[int]]]:
        """(concurrency limit per fairness key, task subqueues per shard) for the coordinator."""
        limits = concurrency_limits((spec for spec, _ in self.tasks.all().values()),
                                    self.config.fairness.key)
        queues = [self.registry.find(name) for name in self.tasks.queues()]
        return limits, ids_by_shard(sq for q in queues if q is not None for sq in q.subqueues)

    def config_value(self) -> Config:
        return self.config

    @signed(MANAGER_OPS["info"])
    async def info(self) -> dict:
        return {"data_dir": self.data_dir, "data_root": self.replicas.data_dir,
                "shards": len(self.shards),
                "scaling_events": self.scaling_events[-50:],
                "background_failures": dict(self.failures.counts)}

    @signed(MANAGER_OPS["task_spec"])
    async def task_spec(self, type_: str) -> TaskSpec | None:
        """The registered spec of job type ``type_``, None when no such type is registered
        (admin only: ``client.redrive`` tells a type from a queue by it)."""
        return self.tasks.get(type_) if isinstance(type_, str) else None

    # -- load and scaling --------------------------------------------------------
    async def _shard_depths(self) -> dict[int, int]:
        await self.refresh()
        return shard_depths(self.registry.all(), self._counts, len(self.shards))

    async def refresh(self) -> None:
        """Read counts and per-subqueue operation counters from every shard."""
        stats = await call_all_async((lambda s=s: s.stats.remote()) for s in self.shards)
        by_shard = ids_by_shard(sq for queue in self.registry.all() for sq in queue.subqueues)
        started = self.clock.now()  # puts admitted after this may be missing from counts
        self._nudged = {}
        counts = await call_all_async((lambda i=i, ids=ids: self.shards[i].counts.remote(ids))
                                for i, ids in by_shard.items())
        read = {sq: n for part in counts for sq, n in part.items()}
        # a session routed during the read may have put after it: its nudge stays, or the
        # next new producer would be sent to the same subqueue
        self._counts = {sq: read.get(sq, 0) + self._nudged.get(sq, 0)
                        for sq in read.keys() | self._nudged.keys()}
        self._counted = (read, started)
        now = self.clock.monotonic()
        for shard_stats in stats:
            self._rates.observe(shard_stats.ops, shard_stats.throttled, now)

    async def scale_once(self) -> None:
        await self.refresh()  # once: a second read would measure rates over milliseconds
        depths = shard_depths(self.registry.all(), self._counts, len(self.shards))
        # each shard's leader's node (the places this manager keeps): added subqueues go
        # to other nodes first
        nodes = {shard: place.leader for shard, place in self.replicas.places.items()}
        now = self.clock.now()
        if not self._shards_started:  # a crash may have come while a shard was added
            await self.replicas.start_missing(data_nodes(self.config))
            self._shards_started = True
        if not self._states_told:  # a crash may have come between registry and shards
            for queue in self.registry.all():
                await self._apply_put_states(queue)
            self._states_told = True
        for queue in self.registry.all():
            if not queue.scales:
                continue
            loads = loads_of(queue, self._counts, self._rates)
            decision = decide(loads, depths, min_subqueues=queue.min_subqueues,
                              quiet_for_s=self._quiet.quiet_for(loads, now),
                              config=self.config.scaling, shard_nodes=nodes,
                              max_shards=self.config.store.max_shards)
            if decision.new_shard:
                place = await self._add_shard(decision.add_on_shard, now)
                depths, nodes = {**depths, place.shard: 0}, {**nodes, place.shard: place.leader}
            await self._apply(queue, decision, now)

    async def _add_shard(self, shard: int, now: float) -> ShardPlace:
        """Start shard ``shard`` (a new writer, docs/autoscaling.md); every component
        learns of it from its place, published before it starts."""
        place = await self.replicas.add_shard(shard, data_nodes(self.config))
        self.shards.grow(shard + 1)
        self.scaling_events.append({"at": now, "event": "add shard", "shard": shard,
                                    "node": place.leader})
        return place

    async def _apply(self, queue: QueueInfo, decision, now: float) -> None:
        if decision.add_on_shard is not None:
            added = self.registry.add_subqueue(queue.ref, decision.add_on_shard)
            self._event("add", queue.ref, added.id, now)
        if decision.retire is not None:
            sq = queue.subqueue(decision.retire)
            await self._set_state(sq.shard, sq.id, SubqueueState.NO_PUT)
            self.registry.set_state(queue.ref, sq.id, SubqueueState.NO_PUT)
            self._quiet.restart([other.id for other in queue.subqueues])
            self._event("retire", queue.ref, sq.id, now)
        for sq_id in decision.drop:
            sq = queue.subqueue(sq_id)
            await self._set_state(sq.shard, sq.id, SubqueueState.DISABLED)
            left = await call_async(lambda: self.shards[sq.shard].counts.remote([sq.id]))
            if left[sq.id]:  # a late put: keep draining
                await self._set_state(sq.shard, sq.id, SubqueueState.NO_PUT)
                continue
            self.registry.drop_subqueue(queue.ref, sq.id)
            self._event("drop", queue.ref, sq.id, now)

    async def _set_state(self, shard: int, sq: int, state: SubqueueState) -> None:
        await call_async(lambda: self.shards[shard].set_state.remote(sq, state.value))

    def _event(self, what: str, queue: str, sq: int, now: float) -> None:
        self.scaling_events.append({"at": now, "event": what, "queue": queue, "subqueue": sq})

    async def _scale_round(self) -> None:
        """One round of the scaling loop (a shard restarting: the next round catches up)."""
        await self._purge(self.registry.pending_purges())  # after a crash mid-clear
        await self.scale_once()
        backlog = task_backlog(map(self.registry.find, self.tasks.queues()), self._counts)
        await self._consumers.follow(backlog)  # also replaces consumers killed for good


class Consumers:
    """The consumer actors: how many are wanted (persisted with whether
    ``scale_consumers`` pinned it), the backlog rule, and keeping them alive."""

    def __init__(self, kv: LmdbKV, config: Config, clock: Clock):
        self.kv, self.config, self.clock = kv, config, clock
        self.rule = ConsumerRule.of(config.consumers)
        raw, pin = kv.read(lambda txn: (txn.get("meta", b"consumers"),
                                        txn.get("meta", b"consumers_pinned")))
        self.state = restored_scale(int(raw) if raw is not None else None, pin == b"1",
                                    rule=self.rule, now=clock.monotonic())
        self.boost = 0
        self._lock = asyncio.Lock()

    @property
    def wanted(self) -> int:
        return self.state.wanted

    async def set_boost(self, extra: int) -> int:
        check_count(extra, "boost", 0, MAX_CONSUMERS)
        if extra != self.boost:
            self.boost = extra
            async with self._lock:
                await self._apply(self.state, ask=True)
        return self.boost

    async def scale(self, count: int | None) -> int:
        """``scale_consumers(count)``: see :func:`rayq.core.control.scaling.chosen_scale`."""
        if count is not None:
            check_count(count, "consumers", 0, MAX_CONSUMERS)
        async with self._lock:  # one reconciliation at a time
            await self._apply(chosen_scale(self.state, count), ask=count is not None)
            return self.wanted

    async def follow(self, backlog: int) -> None:
        """One round of the backlog rule for ``backlog`` tasks (a pinned or fixed count
        stays, and its consumers are kept alive)."""
        async with self._lock:
            state = next_scale(self.state, backlog, self.clock.monotonic(), self.rule)
            await self._apply(state, ask=state.wanted != self.wanted)

    async def _apply(self, state: ConsumerScale, ask: bool) -> None:
        """Make ``state`` the wanted one (persisted when its count or pin changed), ask
        the autoscaler for room for it when ``ask``, and start and stop consumers to
        match."""
        if (state.wanted, state.pinned) != (self.state.wanted, self.state.pinned):
            self.kv.transact(lambda txn: _put_scale(txn, state))
        self.state = state
        if ask:  # before any start: a node takes a while to come
            _request_capacity(self.wanted + self.boost, self.config.consumers.num_cpus)
        running = named_consumers()
        start, stop = consumers_to_change(self.wanted + self.boost, running)
        for index in start:
            _start_consumer(index, self.config)
        # Graceful: a consumer stops polling and finishes what it runs before it goes.
        await asyncio.gather(*(_stop_consumer(running[i]) for i in stop))


def _put_scale(txn, state: ConsumerScale) -> None:
    txn.put("meta", b"consumers", str(state.wanted).encode())
    txn.put("meta", b"consumers_pinned", b"1" if state.pinned else b"0")


def _start_consumer(index: int, config: Config) -> None:
    ConsumerRemote.options(name=consumer_name(index), namespace=namespace(), lifetime="detached",
                           get_if_exists=True, num_cpus=config.consumers.num_cpus,
                           max_restarts=-1, max_task_retries=-1, runtime_env=server_env(),
                           max_concurrency=1000).remote(index, config)


STOP_TIMEOUT_S = 30.0


async def _stop_consumer(handle) -> None:
    """Stop a consumer gracefully: it finishes what it runs (the usage reports of those
    go to their shards with their ends). A consumer that does not answer in time (say,
    one never placed for want of CPUs) is killed all the same: its tasks come back when
    their visibility lapses."""
    try:  # no retry: a consumer that went away will not come back to stop
        await asyncio.wait_for(
            call_async(lambda: handle.stop.remote(STOP_TIMEOUT_S - 5), NO_RETRY), STOP_TIMEOUT_S)
    except (RayqError, ray.exceptions.RayError, asyncio.TimeoutError):
        pass  # gone or stuck: its tasks come back all the same
    ray.kill(handle, no_restart=True)


def _request_capacity(consumers: int, num_cpus: float) -> None:
    """Ask the cluster autoscaler for room for ``consumers`` consumer actors, replacing
    the previous request (fewer bundles withdraw room; a no-op without an autoscaler:
    the request only sits in the GCS)."""
    from ray.autoscaler.sdk import request_resources

    if num_cpus > 0:
        request_resources(bundles=[{"CPU": num_cpus}] * consumers)
