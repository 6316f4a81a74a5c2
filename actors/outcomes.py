"""OutcomeDesk: where the ObjectRefs of ``client.submit`` wait, one desk per shard.

A ref is the return of a desk's ``wait`` call. The desk runs apart from its shard's
leader, restarts by itself wherever Ray can place it (``max_restarts=-1``), and Ray
issues a call it had not answered again to the restarted desk (``max_task_retries=-1``:
the caller's process owns the ref and retries it). So a ref outlives the shard's
failovers, planned leader moves, drains and its desk's own node.

Every shard leader tells its desk of the ends its commits record (:class:`DeskTeller`:
one call at a time, at most one every ``TELL_GAP_S`` under load); a wait looks at those
first, and reads the shard (found again by name when its leader moved) only when it
outlasts ``RECHECK_S`` without news. Those reads of all waits at once ride one call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import ray
from ray.exceptions import RayTaskError

from rayq.names import namespace, server_env, outcome_desk_name
from actors.base import LIVENESS_GROUPS, RuntimeActor
from actors.data_nodes import data_nodes
from rayq.batching import AsyncBatcher
from rayq.config import Config
from rayq.core.control.placement import data_claim
from rayq.core.codec.model import Ending
from rayq.core.kit.batcher import Batcher
from rayq.core.storage.waiters import OutcomeWaiters, found_value
from rayq.errors import RayqError
from rayq.core.kit.clock import Clock
from rayq.remote import answers, call_async, running, shard_link

RECHECK_S = 5.0  # a wait with no news reads the shard this often
MAX_READ_IDS = 10_000  # ids one read of the shard carries
LOOKUP_EVERY_S = 10.0  # a shard looks its desk up again this often (one started anew)
# Under load a shard tells its desk of ends at most once in this long: each call costs
# the two processes about 0.4 ms of CPU, as much as several tiny tasks (told per commit,
# they cost 160 µs a task at 1 800 tasks/s); a ref then waits at most this much longer.
TELL_GAP_S = 0.01


class OutcomeDesk(RuntimeActor):
    """A shard's desk, answering the kit's ``ping`` with its index; it runs no background
    loop (its reads of the shard ride the waits)."""

    def __init__(self, index: int):
        super().__init__("outcome desk", index=index)
        self.shard = shard_link(index)
        reads = Batcher(max_items=MAX_READ_IDS, sized=True, name=f"outcome reads {index}")
        self._reads = AsyncBatcher(reads, self._read_many)
        self.waiters = OutcomeWaiters(self._reads.call, RECHECK_S)

    async def wait(self, message_ids: list[str]) -> Any:
        """Wait until these tasks end: one return each (``num_returns`` = their number),
        all once the last has ended. A task that failed returns a RayTaskError, the value
        Ray itself stores for a raising task, so ``ray.get`` of that one ref raises."""
        found = await self.waiters.wait(message_ids)
        if len(found) == 1:
            return found_value(found[0])
        out = []
        for one in found:
            try:
                out.append(found_value(one))
            except RayqError as err:
                out.append(RayTaskError("wait", "", err))
        return tuple(out)

    @ray.method(max_task_retries=0)  # an end told to no one is read after RECHECK_S
    async def ended(self, packed: bytes) -> None:
        """The ends commits of the shard recorded (the leader tells, never waits), as
        :func:`pack_ends` packs them; an ending None: an end forgotten, the task redriven
        (OutcomeWaiters.notify)."""
        self.waiters.notify(unpack_ends(packed))

    async def _read_many(self, ids: list[str]) -> list:
        """One read of the shard for the ids of many waits (the batcher hands each wait
        its slice of the answers)."""
        return await call_async(lambda: self.shard.task_ends.remote(ids))


OutcomeDeskRemote = ray.remote(concurrency_groups=LIVENESS_GROUPS)(OutcomeDesk)


def outcome_desk(index: int, config: Config):
    """Shard ``index``'s desk, started if it does not run (by whichever process needs it
    first): detached, on no CPU, restarted and its calls issued again when it is lost.
    On a cluster of named data nodes it claims a sliver of the data resource, as store
    copies do: it runs on a data node, never on a worker the autoscaler would otherwise
    find idle and remove (not pinned to one: it restarts on another)."""
    claim = data_claim(data_nodes(config)[0], config.store.data_resource)
    return OutcomeDeskRemote.options(
        name=outcome_desk_name(index), namespace=namespace(), get_if_exists=True,
        lifetime="detached", num_cpus=0, resources=claim, max_restarts=-1,
        max_task_retries=-1, max_concurrency=100_000, runtime_env=server_env()).remote(index)


def pack_ends(finished: list[tuple[str, Ending | None, bytes]]) -> bytes:
    """Ends as one msgpack buffer: Ray moves bytes without pickling the tuples in them."""
    return msgpack.packb([(mid, 0 if ending is None else ending.value, payload)
                          for mid, ending, payload in finished], use_bin_type=True)


def unpack_ends(packed: bytes) -> list[tuple[str, Ending | None, bytes]]:
    return [(mid, Ending(code) if code else None, payload)
            for mid, code, payload in msgpack.unpackb(packed, raw=False)]


class DeskTeller:
    """How a shard leader tells its desk of the ends it recorded: one call at a time,
    the ends recorded while it is under way riding the next (a call per commit cost more
    CPU than the tiny tasks it told of). The desk is looked up again now and then (one
    killed and started anew has another handle); ends told to no desk, or lost with a
    call, are found by the desk's reads."""

    def __init__(self, index: int, clock: Clock):
        self.index, self.clock = index, clock
        self._desk, self._looked = None, float("-inf")
        self._pending: list[tuple[str, Ending | None, bytes]] = []
        self._telling = False
        self._queued = self._sent = 0  # ends queued, and told (or given up on), so far
        self._watchers: list[tuple[int, asyncio.Future]] = []  # (mark, told once sent >= mark)

    def tell(self, finished: list[tuple[str, Ending | None, bytes]]) -> None:
        """Queue ``finished`` for the desk (called on the shard's event loop)."""
        self._pending.extend(finished)
        self._queued += len(finished)
        if self._pending and not self._telling:
            self._telling = True
            asyncio.get_running_loop().create_task(self._send())

    async def told(self) -> None:
        """Wait until everything queued so far was told (or its call failed): a redrive
        answers once the desk forgot the old ends, so a wait after it waits for the new."""
        if self._sent >= self._queued:
            return
        future = asyncio.get_running_loop().create_future()
        self._watchers.append((self._queued, future))
        await future

    def _settle(self, sent: int) -> None:
        self._sent += sent
        waiting, self._watchers = self._watchers, []
        for mark, future in waiting:
            if mark <= self._sent:
                if not future.done():
                    future.set_result(None)
            else:
                self._watchers.append((mark, future))

    async def _send(self) -> None:
        """Tell what is pending. More ends recorded while a call was under way mean load:
        then rest TELL_GAP_S first, so that one call carries all the ends meanwhile. An
        end of a quiet shard (one task at a time) is told at once."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                desk = self._find()
                try:
                    if desk is not None:
                        packed = pack_ends(batch)
                        await answers([lambda: desk.ended.remote(packed)])
                finally:
                    self._settle(len(batch))
                if self._pending:
                    await asyncio.sleep(TELL_GAP_S)
        finally:
            self._telling = False

    def _find(self):
        """The desk's handle, looked up again every LOOKUP_EVERY_S; None when none runs
        (no ref waits on this shard yet)."""
        now = self.clock.monotonic()
        if now - self._looked > LOOKUP_EVERY_S:
            self._looked = now
            self._desk = running([outcome_desk_name(self.index)]).get(
                outcome_desk_name(self.index))
        return self._desk
