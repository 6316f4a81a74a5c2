"""The leader's half of replication: ship each group commit's write set to the
in-sync followers, acknowledge once they all applied it (docs/replication.md).

Group commits are pipelined: the next one commits on the leader while the previous
one ships, and acknowledgements are released in sequence order
(:class:`rayq.core.replication.shard_places.ShipLog`). One sender per follower keeps its
calls in order, sending everything committed since its last call at once (the
follower applies that in one transaction). A follower that fails or does not
answer within ``follower_timeout_s`` is taken out of the in-sync set by the
manager, under a new epoch, and the leader goes on with the rest.

The calls to followers and to the manager are handed in (:class:`Peers`): no Ray here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rayq.core.replication.shard_places import ShardPlace
from rayq.core.replication.shard_places import ShipLog, check_in_sync, set_bytes
from rayq.core.kit.kv import WriteSet
from rayq.errors import NotEnoughReplicas, RayqError, RuntimeFailure, StaleEpoch

log = logging.getLogger("rayq.shipping")
FOLLOWER_TIMEOUT_S = 5.0   # a follower slower than this is taken out of the in-sync set
MAX_SETS_PER_CALL = 512    # write sets (group commits) one apply call carries at most
MAX_BYTES_PER_CALL = 64 << 20  # ... and values of at most this many bytes (but one set always)
# A follower is given FOLLOWER_TIMEOUT_S plus this long per byte it is sent: a task's
# body of 256 MiB takes a few seconds to travel and to be written.
FOLLOWER_S_PER_BYTE = 1.0 / (32 << 20)
MANAGER_RETRY_S = 1.0      # while the manager is away, the in-sync change waits


class Peers(Protocol):
    """The calls a leader makes; any failure raises (a RayqError passes as itself)."""

    async def state(self, node: str) -> tuple[int, int]: ...
    async def apply(self, node: str, epoch: int, first_seq: int, sets: list[WriteSet]) -> int: ...
    async def shrink(self, node: str, epoch: int) -> ShardPlace: ...
    async def rejoin(self, node: str, epoch: int) -> ShardPlace: ...


@dataclass(frozen=True)
class Shipped:
    """A call's result whose group commit ships to the followers: ``acked`` resolves
    once they all applied it."""

    value: Any
    acked: asyncio.Future


def value_of(result: Any) -> Any:
    """A call's own result, shipped or not."""
    return result.value if isinstance(result, Shipped) else result


async def acknowledged(pending: asyncio.Future) -> Any:
    """A call's result once its group commit is acknowledged by the in-sync followers:
    the value, or the error that refused it (the call's own error first)."""
    result = await pending
    if not isinstance(result, Shipped):
        return result
    try:
        await result.acked
    except RayqError as err:
        return result.value if isinstance(result.value, BaseException) else err
    return result.value


class OneCopy:
    """The shipper of a shard that keeps one copy: every commit is its acknowledgement,
    nothing is recorded or shipped (the default on one machine)."""

    place = None

    def check(self) -> None:
        pass

    def acked(self, pending: asyncio.Future) -> Awaitable:
        return pending

    def ship(self, results: list, writes: WriteSet | None) -> list:
        return results


class Shipper:
    def __init__(self, index: int, place: ShardPlace, committed: int, min_in_sync: int,
                 peers: Peers, follower_timeout_s: float = FOLLOWER_TIMEOUT_S):
        self.index, self.place, self.min_in_sync = index, place, min_in_sync
        self.peers, self.timeout_s = peers, follower_timeout_s
        self.log = ShipLog(committed, place.in_sync[1:])
        self.refused: RayqError | None = None  # set once a newer epoch replaced this leader
        self._more = {node: asyncio.Event() for node in self.log.followers}
        # seeded followers acknowledgements wait for, not yet in sync: the last write set
        # committed when they were counted (in sync once they applied it)
        self._counted_at: dict[str, int] = {}
        self._joined: dict[str, asyncio.Future] = {}  # seedings waiting for their follower
        self._senders = [asyncio.get_running_loop().create_task(self._send_forever(node))
                         for node in self.log.followers]

    def check(self) -> None:
        """Raise StaleEpoch when this leader was replaced, NotEnoughReplicas when too few
        copies are in sync: a write would not be acknowledged."""
        if self.refused is not None:
            raise self.refused
        check_in_sync(self.place, self.min_in_sync)

    def acked(self, pending: asyncio.Future) -> Awaitable:
        """A call's result once acknowledged (see :func:`acknowledged`)."""
        return acknowledged(pending)

    def ship(self, results: list, writes: WriteSet) -> list:
        """The results of a group commit, acknowledged once every in-sync follower
        applied its write set (see :func:`acknowledged`)."""
        acked = asyncio.get_running_loop().create_future()
        self.log.wait(self.log.add(writes), acked)
        for event in self._more.values():
            event.set()
        self._release()
        return [Shipped(r, acked) for r in results]

    async def seed(self, node: str, copy: Callable[[], Awaitable[int]],
                   install: Callable[[int], Awaitable[None]]) -> int:
        """Seed a follower on ``node``: ``copy()`` takes a consistent copy of the store
        and returns the sequence number it holds, ``install(seq)`` brings it to the
        follower; the write sets after it follow, and once the follower caught up the
        manager puts it in sync. Returns the copy's sequence number once the follower
        is in sync; raises if it is lost before."""
        self.log.join(node)  # before the copy: the write sets after it are kept
        self._counted_at.pop(node, None)
        self._more[node] = asyncio.Event()
        try:
            seq = await copy()
            self.log.copied(node, seq)
            await install(seq)
        except BaseException:
            self.log.remove(node)
            raise
        joined = self._joined[node] = asyncio.get_running_loop().create_future()
        self._senders.append(asyncio.get_running_loop().create_task(
            self._send_forever(node, seeded=True)))
        await joined
        return seq

    async def _send_forever(self, node: str, seeded: bool = False) -> None:
        try:
            if not seeded:
                await self._handshake(node)
            while self.log.follows(node) and self.refused is None:
                await self._send(node)
        except StaleEpoch as err:
            self._refuse(err)
        except Exception as err:  # the follower failed, is gone or is too slow
            log.warning("shard %d: follower on %s lost: %r", self.index, node, err)
            await self._out_of_sync(node)
        finally:
            self._settle(node, RuntimeFailure(
                f"shard {self.index}: the follower on {node} was lost before it was in sync"))

    def _settle(self, node: str, error: Exception | None = None) -> None:
        """End the wait of ``node``'s seeding: in sync (no ``error``) or lost."""
        joined = self._joined.pop(node, None)
        if joined is not None and not joined.done():
            if error is None:
                joined.set_result(None)
            else:
                joined.set_exception(error)

    async def _send(self, node: str) -> None:
        first, sets = self.log.batch(node, MAX_SETS_PER_CALL, MAX_BYTES_PER_CALL)
        if not sets:
            self._more[node].clear()
            await self._more[node].wait()
            return
        timeout_s = self.timeout_s + FOLLOWER_S_PER_BYTE * sum(map(set_bytes, sets))
        applied = await asyncio.wait_for(
            self.peers.apply(node, self.place.epoch, first, sets), timeout_s)
        self.log.applied(node, applied)
        self._release()
        if self.log.caught_up(node, lag=MAX_SETS_PER_CALL):
            # A seeded follower one call behind: acknowledgements wait for it from now
            # on; the earlier ones did not, so it joins once it holds those too.
            self.log.count(node)
            self._counted_at[node] = self.log.committed
        mark = self._counted_at.get(node)
        if mark is not None and self.log.acked[node] >= mark:
            del self._counted_at[node]
            await self._rejoin(node)

    async def _rejoin(self, node: str) -> None:
        """A seeded follower holds every acknowledged write set, and acknowledgements
        wait for it: the manager puts it in sync (a new epoch), so failover may promote it."""
        try:
            self.place = await self.peers.rejoin(node, self.place.epoch)
        except StaleEpoch as err:
            self._refuse(err)
            return
        log.info("shard %d: follower on %s in sync, epoch %d", self.index, node, self.place.epoch)
        self._settle(node)

    async def _handshake(self, node: str) -> None:
        """A follower is in sync only if it applied exactly what this leader committed
        before it started (else it is out of sync until seeded again)."""
        epoch, seq = await asyncio.wait_for(self.peers.state(node), self.timeout_s)
        if epoch > self.place.epoch:
            raise StaleEpoch(f"shard {self.index}: follower on {node} holds epoch {epoch}")
        if seq != self.log.acked.get(node):
            raise NotEnoughReplicas(f"follower on {node} applied {seq}, the leader "
                                    f"{self.log.acked.get(node)}: out of sync")

    async def _out_of_sync(self, node: str) -> None:
        """Ask the manager to take ``node`` out of the in-sync set (until it did, the
        acknowledgements wait: the set it keeps durably is the one failover trusts)."""
        while self.refused is None:
            try:
                place = await self.peers.shrink(node, self.place.epoch)
            except StaleEpoch as err:
                self._refuse(err)
            except Exception as err:  # the manager is away: ask again
                log.warning("shard %d: cannot take %s out of sync yet: %r", self.index, node, err)
                await asyncio.sleep(MANAGER_RETRY_S)
            else:
                self._shrunk(node, place)
                return

    def _shrunk(self, node: str, place: ShardPlace) -> None:
        self.place = place
        self.log.remove(node)
        self._counted_at.pop(node, None)
        try:
            check_in_sync(place, self.min_in_sync)
        except NotEnoughReplicas as err:
            self._fail(err)
        self._release()

    def _release(self) -> None:
        for acked in self.log.released():
            if not acked.done():
                acked.set_result(None)

    def _fail(self, err: RayqError) -> None:
        for acked in self.log.all_waiting():
            if not acked.done():
                acked.set_exception(err)

    def _refuse(self, err: RayqError) -> None:
        """A newer epoch replaced this leader: nothing it wrote is acknowledged any more."""
        log.warning("shard %d: refused by a newer epoch: %s", self.index, err)
        self.refused = err
        self._fail(err)
        for event in self._more.values():
            event.set()

    def stop(self) -> None:
        for sender in self._senders:
            sender.cancel()
