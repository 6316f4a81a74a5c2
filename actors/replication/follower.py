"""FollowerActor: a shard's copy on another data node (docs/replication.md).

It holds an LMDB environment laid out as a leader's, at
``<data_dir>/<node>/shard-<i>``, so the manager promotes it by opening a ShardActor
on that folder. The leader's write sets arrive in order: one caller, one call at a
time (``max_concurrency=1``), and sequence numbers checked by
:class:`rayq.core.replication.replica.Replica`. They come over the follower's stream
(:mod:`rayq.core.replication.stream`), a Unix socket for a leader on this host and TCP
for one on another, which it opens when a leader first asks where it listens
(:meth:`FollowerActor.stream`); through Ray when a write set is too large for a frame.
A lock keeps the stream's calls and Ray's one at a time.
"""

from __future__ import annotations

import os
import threading

import ray

from actors.channel import socket_dir
from rayq.channel import host_id
from rayq.core.kit.kv import unpack_write_sets
from rayq.core.kit.private import FILE_MODE
from rayq.core.replication.replica import check_epoch, clear_for_seed, open_copy
from rayq.core.replication.stream import StreamServer, new_key
from rayq.errors import InvalidMessage


class FollowerActor:
    """One copy of a shard. It stands apart from the actor kit (:mod:`actors.base`): a
    threaded actor, one call at a time, with no clock, background loop or ping (the
    keeper asks its ``state``); an async method of the kit's would make Ray run it as an
    async actor."""

    def __init__(self, index: int, path: str, map_bytes: int = 256 << 20):
        self.index, self.path, self._map_bytes = index, path, map_bytes
        self.replica = open_copy(path, map_bytes)
        self._lock = threading.Lock()  # the stream's calls and Ray's, one at a time
        self._key = new_key()
        self._servers: dict[str, StreamServer] = {}  # "unix" / "tcp" -> its server
        self._applies = {"stream": 0, "ray": 0}  # apply calls served, by the way they came

    def apply(self, epoch: int, first_seq: int, *parts: bytes) -> int:
        """Apply the write sets the leader packed (:func:`pack_write_sets`), in parts
        (:func:`rayq.core.kit.kv.inline_parts`)."""
        return self._apply(epoch, first_seq, parts[0] if len(parts) == 1 else b"".join(parts),
                           "ray")

    def _apply(self, epoch: int, first_seq: int, packed: bytes, way: str) -> int:
        with self._lock:
            self._applies[way] += 1
            return self.replica.apply(epoch, first_seq, unpack_write_sets(packed))

    def applies(self) -> dict[str, int]:
        """Apply calls served so far, by the way they came: "stream" or "ray"."""
        return dict(self._applies)

    def fence(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self.replica.fence(epoch)

    def state(self) -> tuple[int, int]:
        """(epoch held, last applied sequence number)."""
        return self.replica.epoch, self.replica.seq

    def stream(self, leader_host: str) -> tuple:
        """Where a leader on ``leader_host`` (:func:`rayq.channel.host_id`) sends its write
        sets: ("unix", path) on this host, else ("tcp", address, port, key) on this node's
        address, every frame MAC'd with ``key`` (see :mod:`rayq.core.replication.stream`).
        Answered through Ray only, so only a caller Ray let in learns the key."""
        kind = "unix" if leader_host == host_id() else "tcp"
        with self._lock:
            server = self._servers.get(kind)
            if server is None:
                name = f"rayq-follower-{self.index}"
                if kind == "unix":
                    path = os.path.join(socket_dir(self.path, f"follower-{self.index}"), "s")
                    server = StreamServer.unix(path, self._streamed, name)
                else:
                    server = StreamServer.tcp(ray.util.get_node_ip_address(), self._streamed,
                                              self._key, name)
                self._servers[kind] = server
        if kind == "unix":
            return ("unix", server.path)
        return ("tcp", ray.util.get_node_ip_address(), server.port, self._key)

    def _streamed(self, method: str, args: list) -> int:
        """A call that came over the stream: ``apply`` only."""
        if method != "apply" or len(args) != 3:
            raise InvalidMessage(f"{method!r} is not served on a follower's stream")
        epoch, first_seq, packed = args
        return self._apply(epoch, first_seq, packed, "stream")

    # -- seeding: the leader's consistent copy arrives in chunks -------------------
    def begin_seed(self, epoch: int, seq: int) -> None:
        """Drop this copy: a fresh one from the leader of ``epoch``, as of ``seq``,
        replaces it (this one is kept aside if it applied more: see
        :func:`clear_for_seed`). Refused with StaleEpoch when this copy holds a newer
        epoch: a replaced leader's late seed."""
        with self._lock:
            check_epoch(self.replica.epoch, epoch, "seed")
            self.replica.kv.close()
            clear_for_seed(self.path, seq)
        self._part = os.fdopen(os.open(os.path.join(self.path, "data.mdb"),
                                       os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE), "wb")

    def seed_chunk(self, data: bytes) -> None:
        self._part.write(data)

    def end_seed(self, epoch: int, seq: int) -> int:
        """The copy is whole: make it durable, open it, hold ``epoch`` and ``seq``."""
        self._part.flush()
        os.fsync(self._part.fileno())
        self._part.close()
        with self._lock:
            self.replica = open_copy(self.path, self._map_bytes)
            self.replica.install(epoch, seq)
        return seq

    def close(self) -> None:
        """Close the environment (before a ShardActor opens this folder as leader), and
        the streams: a leader's call under way fails, and nothing applies after."""
        for server in self._servers.values():
            server.close()
        with self._lock:
            self.replica.kv.close()

    def process(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


FollowerRemote = ray.remote(num_cpus=0, max_concurrency=1)(FollowerActor)
