"""The leader's side of replication in a shard actor (docs/replication.md): its write
sets collected and stamped, its calls to its followers and to the manager for
:class:`rayq.core.replication.shipping.Shipper`, and seeding a new follower."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

import ray

from rayq.channel import host_id
from rayq.names import namespace
from actors.data_nodes import published_places
from rayq.config import Config
from rayq.core.kit.clock import Clock
from rayq.core.replication.shard_places import ShardPlace
from rayq.core.replication.shard_places import one_copy
from rayq.core.replication.shipping import OneCopy as _OneCopyShipper, Shipper
from rayq.core.replication.stream import StreamClient
from rayq.core.codec.frames import FrameTooLarge
from rayq.errors import RuntimeFailure
from rayq.core.kit.kv import LmdbKV, Write, WriteSet, inline_parts, pack_write_sets
from rayq.core.kit.private import FILE_MODE, make_private_dir
from rayq.core.storage.layout import REPLICA_KEY, read_replica_state, replica_state
from rayq.remote import IN_RUNTIME, NO_RETRY, call_async, manager_link


FOLLOWER_PREFIX = "rayq-follower-"


def follower_name(index: int, node: str) -> str:
    return f"{FOLLOWER_PREFIX}{index}-{node}"


STREAM_CONNECT_S = 2.0  # a follower's stream that does not answer this fast is not used
STREAM_RETRY_S = 5.0    # ... and not tried again for this long: Ray carries the applies


class RayPeers:
    """Followers by name (``rayq-follower-<shard>-<node>``), each call tried once; the
    manager with the runtime's retries, found again when it moved (a call to a manager
    lost with its node fails once the manager is replaced, and goes to the new one).
    Write sets go over each follower's stream (:mod:`rayq.core.replication.stream`),
    through Ray while it cannot be reached."""

    def __init__(self, index: int, clock: Clock):
        self.index, self._clock = index, clock
        self._followers: dict[str, object] = {}
        self._streams: dict[str, StreamClient] = {}
        self._stream_retry_at: dict[str, float] = {}
        self._manager = manager_link()

    def _follower(self, node: str):
        found = self._followers.get(node)
        if found is None:
            found = self._followers[node] = ray.get_actor(follower_name(self.index, node),
                                                          namespace=namespace())
        return found

    def forget(self, node: str) -> None:
        """Look ``node``'s follower up anew next time (the manager started another)."""
        self._followers.pop(node, None)
        self._stream_retry_at.pop(node, None)
        stream = self._streams.pop(node, None)
        if stream is not None:
            stream.close()

    async def _call(self, node: str, method: str, *args) -> Any:
        try:
            follower = self._follower(node)
            return await call_async(lambda: getattr(follower, method).remote(*args), NO_RETRY)
        except BaseException:
            self.forget(node)  # gone, or replaced under its name
            raise

    async def state(self, node: str) -> tuple[int, int]:
        return await self._call(node, "state")

    async def apply(self, node: str, epoch: int, first_seq: int, sets: list[WriteSet]) -> int:
        packed = pack_write_sets(sets)
        stream = await self._stream(node)
        if stream is not None:
            try:
                return await stream.call("apply", epoch, first_seq, packed)
            except FrameTooLarge:
                pass  # Ray carries it
            except BaseException:
                self.forget(node)
                raise
        return await self._call(node, "apply", epoch, first_seq, *inline_parts(packed))

    async def _stream(self, node: str) -> StreamClient | None:
        """``node``'s follower's stream, connected at first use; None while it cannot be
        reached (tried again STREAM_RETRY_S later)."""
        stream = self._streams.get(node)
        if stream is not None and not stream.closed:
            return stream
        if self._clock.monotonic() < self._stream_retry_at.get(node, 0.0):
            return None
        try:
            follower = self._follower(node)
            address = await asyncio.wait_for(
                call_async(lambda: follower.stream.remote(host_id()), NO_RETRY),
                STREAM_CONNECT_S)
            stream = self._streams[node] = await StreamClient.connect(address, STREAM_CONNECT_S)
            return stream
        except Exception:
            self._stream_retry_at[node] = self._clock.monotonic() + STREAM_RETRY_S
            return None

    async def shrink(self, node: str, epoch: int) -> ShardPlace:
        return await call_async(
            lambda: self._manager.shrink_in_sync.remote(self.index, node, epoch), IN_RUNTIME)

    async def rejoin(self, node: str, epoch: int) -> ShardPlace:
        return await call_async(
            lambda: self._manager.rejoin_in_sync.remote(self.index, node, epoch), IN_RUNTIME)


ONE_COPY = _OneCopyShipper()
SEED_CHUNK_BYTES = 4 << 20  # a copy travels to a new follower in chunks this large


def copy_store(kv: LmdbKV, folder: str) -> None:
    """A consistent copy of ``kv`` in ``folder`` (as of one read transaction)."""
    shutil.rmtree(folder, ignore_errors=True)
    make_private_dir(folder)
    with kv.env.begin() as txn:
        kv.env.copy(folder, compact=True, txn=txn)
    os.chmod(os.path.join(folder, "data.mdb"), FILE_MODE)  # LMDB's copy follows the umask


async def send_copy(index: int, node: str, folder: str, epoch: int, seq: int) -> None:
    """Ship the copy in ``folder`` to shard ``index``'s follower on ``node``, through Ray
    in chunks (no shared disk), and have it open the copy as of ``epoch`` and ``seq``."""
    follower = ray.get_actor(follower_name(index, node), namespace=namespace())
    await call_async(lambda: follower.begin_seed.remote(epoch, seq), NO_RETRY)
    with open(os.path.join(folder, "data.mdb"), "rb") as copy:
        while chunk := copy.read(SEED_CHUNK_BYTES):
            await call_async(lambda chunk=chunk: follower.seed_chunk.remote(chunk), NO_RETRY)
    await call_async(lambda: follower.end_seed.remote(epoch, seq), NO_RETRY)


def replication_of(index: int, path: str, kv: LmdbKV, config: Config,
                   clock: Clock) -> "Replication | OneCopy":
    """The leader's replication, unless the shard keeps one copy (the embedded runtime,
    ``replicas=1``) or was never placed: then nothing is recorded or changes."""
    place = published_places().get(index)
    if one_copy(place, config.store.replicas):
        return OneCopy()
    return Replication(index, path, kv, place, config.store.min_in_sync, clock)


class OneCopy:
    """No replication: nothing stamped, nothing taken, nothing to seed."""

    shipper = ONE_COPY

    def stamp(self, txn) -> None:
        pass

    def take(self) -> None:
        return None

    async def seed(self, node: str, on_store_thread) -> int:
        raise RuntimeFailure(f"a shard that keeps one copy seeds no follower (on {node})")


class Replication:
    """Write sets collected on the store thread (in commit order), one per group commit
    with the sequence number the group stamps durably; shipped by :attr:`shipper`."""

    def __init__(self, index: int, path: str, kv: LmdbKV, place: ShardPlace, min_in_sync: int,
                 clock: Clock):
        self.index, self.path, self.kv = index, path, kv
        _, self.seq = read_replica_state(kv.read(lambda txn: txn.get("meta", REPLICA_KEY)))
        # the store's scalars as it opened them (written before anything was watched) go
        # with the first group commit: a new follower starts from the same ones
        self._unshipped: list = [tuple(Write("meta", k, v) for k, v in kv.read(
            lambda txn: list(txn.scan("meta", b""))))]
        kv.watch(self._unshipped.append)
        self.shipper = Shipper(index, place, self.seq, min_in_sync, RayPeers(index, clock))

    def stamp(self, txn) -> None:
        """In the group's transaction: its sequence number, durable with it (a
        restarted leader knows how far it got; a follower stores it likewise)."""
        txn.put("meta", REPLICA_KEY, replica_state(self.shipper.place.epoch, self.seq + 1))

    def take(self) -> WriteSet:
        """After the group committed: its write set, with those of the transactions
        since the last group (set states, background removal)."""
        self.seq += 1
        writes = tuple(w for written in self._unshipped for w in written)
        self._unshipped.clear()
        return writes

    async def seed(self, node: str, on_store_thread) -> int:
        """Seed a follower on ``node``: a consistent copy of the store (taken on the
        store thread, between group commits) goes to it in chunks, the write sets
        after the copy follow, and it joins the in-sync set once caught up. Returns
        the copy's sequence number once it is in sync."""
        folder = os.path.join(os.path.dirname(self.path), f"seeding-{self.index}-{node}")
        epoch = self.shipper.place.epoch
        self.shipper.peers.forget(node)  # the manager started this follower anew

        async def install(seq: int) -> None:
            try:
                await send_copy(self.index, node, folder, epoch, seq)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        try:
            return await self.shipper.seed(node, lambda: on_store_thread(self._copy, folder),
                                           install)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _copy(self, folder: str) -> int:
        copy_store(self.kv, folder)
        return self.seq
