"""The ordered key-value layer under a shard: LMDB, durable by default.

The queue logic in :mod:`rayq.core.storage.store` sees only :class:`Txn` (get, put,
delete, ordered scan, nested transaction); :mod:`rayq.testing` provides the
same over plain dicts. Transactions are context managers that abort on error.

The write set: a KV opened with ``on_commit`` hands it, after each committed write
transaction, that transaction's mutations in the order they were made (a
:class:`Write` per put or delete; a nested transaction's only when it committed),
and write sets arrive in commit order. :func:`apply_writes` replays one in a
transaction, so ``kv.transact(lambda txn: apply_writes(txn, writes))`` (or
``kv.apply(writes)``) brings another KV to the same state: what replication ships.
Without ``on_commit`` nothing is recorded and a transaction costs what it did.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol, TypeVar

import lmdb
import msgpack

from rayq.core.kit.private import FILE_MODE, make_private_dir
from rayq.core.kit.tuples import quick_new
from rayq.errors import StoreError

T = TypeVar("T")
DATABASES = ("rows", "expiry", "blobs", "counts", "keys", "meta", "outcomes", "outcome_expiry",
             "spill", "tcounts", "nonces", "inflight", "task_ids", "tasks", "usage", "promote")


class Write(NamedTuple):
    """One mutation of a write transaction: ``value`` None deletes ``key``."""

    table: str
    key: bytes
    value: bytes | None


class Rewrite(NamedTuple):
    """A value moved or rewritten with its tail unchanged: the value at ``key`` becomes
    ``value`` (its head) followed by what the value at ``source`` holds past
    ``len(value)``; ``source`` is deleted unless it is ``key``; ``size`` is the whole new
    value's length. A copy replays it from its own value at ``source``, so a receive,
    which moves every row it hides to a new key with a new header, ships keys and
    headers rather than every body again."""

    table: str
    key: bytes
    value: bytes
    source: bytes
    size: int


def write_bytes(write: Write | Rewrite) -> int:
    """The bytes a write puts when replayed (0 for a delete)."""
    if len(write) == 5:
        return write[4]
    return len(write[2]) if write[2] is not None else 0


WriteSet = tuple[Write | Rewrite, ...]
_write = quick_new(Write)  # one per mutation a recorded transaction makes
_rewrite = quick_new(Rewrite)
OnCommit = Callable[[WriteSet], None]


class Txn(Protocol):
    def get(self, db: str, key: bytes) -> bytes | None: ...
    def put(self, db: str, key: bytes, value: bytes) -> None: ...
    def delete(self, db: str, key: bytes) -> bool: ...
    def putmulti(self, db: str, items: list[tuple[bytes, bytes]]) -> None: ...
    def move_many(self, db: str, moves: list[tuple[bytes, bytes, bytes]], kept_from: int) -> None: ...
    def scan(self, db: str, start: bytes, stop: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...
    def scan_keys(self, db: str, start: bytes, stop: bytes | None = None) -> Iterator[bytes]: ...
    def nested(self) -> contextlib.AbstractContextManager["Txn"]: ...


class KV(Protocol):
    def transact(self, fn: Callable[[Txn], T]) -> T: ...
    def read(self, fn: Callable[[Txn], T]) -> T: ...
    def apply(self, writes: Iterable[Write]) -> None: ...
    def info(self) -> dict[str, int]: ...
    def close(self) -> None: ...


def apply_writes(txn: Txn, writes: Iterable[Write | Rewrite]) -> None:
    """Replay a write set in ``txn``, in its order. StoreError when a :class:`Rewrite`
    finds no value at its source, or one of another length: this copy does not hold
    what the writer held.

    Puts that follow each other into one table go in one ``putmulti`` (a C loop): the
    same puts in the same order. A put of 500 messages records its rows, then their
    expiry entries; a receive its moves, then the expiry entries of their new keys."""
    puts: list[tuple[bytes, bytes]] = []
    into = ""  # the table of the puts gathered
    for write in writes:
        if len(write) == 3 and write[2] is not None:
            table, key, value = write
            if table != into:
                if puts:
                    txn.putmulti(into, puts)
                    puts = []
                into = table
            puts.append((key, value))
            continue
        if puts:
            txn.putmulti(into, puts)
            puts = []
        if len(write) == 3:
            txn.delete(write[0], write[1])
        else:
            _replay_move(txn, *write)
    if puts:
        txn.putmulti(into, puts)


def _replay_move(txn: Txn, table: str, key: bytes, head: bytes, source: bytes,
                 size: int) -> None:
    """One :class:`Rewrite`, from this copy's own value at ``source``."""
    old = txn.get(table, source)
    if old is None:
        raise StoreError(f"a replayed move finds nothing at {table} {bytes(source).hex()}")
    value = head + old[len(head):]
    if len(value) != size:
        raise StoreError(f"a replayed move of {table} {bytes(source).hex()} makes "
                         f"{len(value)} bytes, the writer's {size}")
    if source != key:
        txn.delete(table, source)
    txn.put(table, key, value)


def recorded_moves(db: str, moves: list[tuple[bytes, bytes, bytes]],
                   kept_from: int) -> list[Rewrite]:
    """How a recorded transaction lists ``moves`` of ``move_many``: one Rewrite each."""
    return [_rewrite((db, bytes(key), bytes(value[:kept_from]), bytes(source), len(value)))
            for source, key, value in moves]


def move_rows(txn: Txn, db: str, moves: list[tuple[bytes, bytes, bytes]]) -> None:
    """Each (source, key, value) of ``moves``: ``value`` under ``key``, ``source``
    deleted unless it is ``key``; the deletes first, then the puts in one C loop."""
    for source, key, _ in moves:
        if source != key:
            txn.delete(db, source)
    txn.putmulti(db, [(key, value) for _, key, value in moves])


def pack_write_sets(write_sets: Sequence[WriteSet]) -> bytes:
    """Write sets as one msgpack buffer, to cross Ray: pickling every :class:`Write`
    cost more than the follower's commit."""
    return msgpack.packb(write_sets, use_bin_type=True)  # tuples (Write too) pack as arrays


# Ray passes an argument of up to 100 KiB (its max_direct_call_object_size) inside the
# call, and a larger one through the object store, which costs about a millisecond more
# (1.9 ms against 1.0 ms for 166 KB on this machine): packed write sets travel as parts
# under that size, each passed inline.
INLINE_PART_BYTES = 96_000


def inline_parts(packed: bytes) -> list[bytes]:
    """``packed`` cut into parts of at most :data:`INLINE_PART_BYTES` (one part at least)."""
    return [packed[i:i + INLINE_PART_BYTES]
            for i in range(0, max(len(packed), 1), INLINE_PART_BYTES)]


def unpack_write_sets(packed: bytes) -> list[list]:
    """The write sets of :func:`pack_write_sets`, each a list of writes, (table, key,
    value) or a :class:`Rewrite`'s five fields, that :func:`apply_writes` replays."""
    return msgpack.unpackb(packed, raw=False)


class _LmdbTxn:
    __slots__ = ("_txn", "_dbs", "_env")

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction, dbs: dict):
        self._env, self._txn, self._dbs = env, txn, dbs

    def get(self, db: str, key: bytes) -> bytes | None:
        return self._txn.get(key, db=self._dbs[db])

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self._txn.put(key, value, db=self._dbs[db])

    def delete(self, db: str, key: bytes) -> bool:
        return self._txn.delete(key, db=self._dbs[db])

    def putmulti(self, db: str, items: list[tuple[bytes, bytes]]) -> None:
        """Many puts in one C loop (py-lmdb's Cursor.putmulti)."""
        if items:
            self._txn.cursor(db=self._dbs[db]).putmulti(items)

    def move_many(self, db: str, moves: list[tuple[bytes, bytes, bytes]], kept_from: int) -> None:
        """Each (source, key, value) of ``moves``: ``value`` under ``key`` in place of the
        value at ``source`` (deleted unless it is ``key``). ``value[kept_from:]`` must
        equal the source's value from ``kept_from`` on: a recorded transaction lists
        each as a :class:`Rewrite` of ``value[:kept_from]``."""
        move_rows(self, db, moves)

    def scan(self, db: str, start: bytes, stop: bytes | None = None):
        cursor = self._txn.cursor(db=self._dbs[db])
        if not cursor.set_range(start):
            return
        for key, value in cursor:
            if stop is not None and key >= stop:
                return
            yield key, value

    def scan_keys(self, db: str, start: bytes, stop: bytes | None = None):
        """Keys only: the values are not copied out of the map."""
        cursor = self._txn.cursor(db=self._dbs[db])
        if not cursor.set_range(start):
            return
        for key in cursor.iternext(keys=True, values=False):
            if stop is not None and key >= stop:
                return
            yield key

    @contextlib.contextmanager
    def nested(self):
        """A child transaction: its writes vanish if the block raises, the parent goes on."""
        child = self._env.begin(write=True, parent=self._txn)
        try:
            yield _LmdbTxn(self._env, child, self._dbs)
        except BaseException:
            child.abort()
            raise
        child.commit()


class _RecordingTxn(_LmdbTxn):
    """An LMDB write transaction that also lists its mutations (see :class:`Write`)."""

    __slots__ = ("writes",)

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction, dbs: dict):
        super().__init__(env, txn, dbs)
        self.writes: list[Write] = []

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self._txn.put(key, value, db=self._dbs[db])
        self.writes.append(_write((db, bytes(key), bytes(value))))

    def delete(self, db: str, key: bytes) -> bool:
        deleted = self._txn.delete(key, db=self._dbs[db])
        if deleted:
            self.writes.append(_write((db, bytes(key), None)))
        return deleted

    def putmulti(self, db: str, items: list[tuple[bytes, bytes]]) -> None:
        super().putmulti(db, items)
        self.writes.extend([_write((db, bytes(k), bytes(v))) for k, v in items])

    def move_many(self, db: str, moves: list[tuple[bytes, bytes, bytes]], kept_from: int) -> None:
        move_rows(super(), db, moves)
        self.writes.extend(recorded_moves(db, moves, kept_from))

    @contextlib.contextmanager
    def nested(self):
        """A child transaction: its writes (and their record) vanish if the block raises."""
        child = self._env.begin(write=True, parent=self._txn)
        recording = _RecordingTxn(self._env, child, self._dbs)
        try:
            yield recording
        except BaseException:
            child.abort()
            raise
        child.commit()
        self.writes.extend(recording.writes)


class LmdbKV:
    """One LMDB environment: named sub-databases, fsync on commit, growing map."""

    def __init__(self, path: str | os.PathLike, *, map_size: int = 256 << 20,
                 durable: bool = True, on_commit: OnCommit | None = None):
        make_private_dir(path)
        try:
            self.env = lmdb.open(str(path), map_size=map_size, max_dbs=len(DATABASES) + 2,
                                 sync=durable, metasync=durable, writemap=False,
                                 max_readers=256, lock=True, mode=FILE_MODE)
        except lmdb.Error as err:
            raise StoreError(f"cannot open LMDB environment at {path}: {err}") from err
        self.env.reader_check()  # clear reader slots left by crashed processes
        self._dbs = {name: self.env.open_db(name.encode()) for name in DATABASES}
        self._on_commit = on_commit
        self._commit_order = threading.Lock()  # write sets leave in commit order

    def watch(self, on_commit: OnCommit | None) -> None:
        """From now on hand each committed write set to ``on_commit`` (None: stop)."""
        self._on_commit = on_commit

    def transact(self, fn: Callable[[Txn], T]) -> T:
        """Run ``fn`` in one write transaction (one commit, one fsync); grow the map when full."""
        if self._on_commit is not None:
            return self._transact_recorded(fn, self._on_commit)
        while True:
            txn = self.env.begin(write=True)
            try:
                result = fn(self._wrap(txn))
                txn.commit()
                return result
            except BaseException as err:
                txn.abort()
                if not isinstance(err, lmdb.MapFullError):
                    _raise_engine(err)
                self._grow()

    def _transact_recorded(self, fn: Callable[[Txn], T], on_commit: OnCommit) -> T:
        with self._commit_order:
            while True:
                txn = self.env.begin(write=True)
                recording = _RecordingTxn(self.env, txn, self._dbs)
                try:
                    result = fn(recording)
                    txn.commit()
                    break
                except BaseException as err:
                    txn.abort()
                    if not isinstance(err, lmdb.MapFullError):
                        _raise_engine(err)
                    self._grow()
            if recording.writes:
                on_commit(tuple(recording.writes))
            return result

    def apply(self, writes: Iterable[Write]) -> None:
        """Replay a write set in one transaction."""
        self.transact(lambda txn: apply_writes(txn, writes))

    def read(self, fn: Callable[[Txn], T]) -> T:
        with self.env.begin(write=False, buffers=False) as txn:
            return fn(self._wrap(txn))

    def _wrap(self, txn: lmdb.Transaction) -> Txn:
        return _LmdbTxn(self.env, txn, self._dbs)

    def _grow(self) -> None:
        size = self.env.info()["map_size"]
        self.env.set_mapsize(size * 2)

    def info(self) -> dict[str, int]:
        info, stat = self.env.info(), self.env.stat()
        return {"map_size_bytes": info["map_size"],
                "used_bytes": (info["last_pgno"] + 1) * stat["psize"]}

    def close(self) -> None:
        self.env.close()


def peek(path: str | os.PathLike, table: str, key: bytes) -> bytes | None:
    """``key`` of ``table`` in the LMDB environment at ``path``, opened read-only for this
    one read (another process may hold it open). None: no such environment, table or key."""
    if not os.path.exists(os.path.join(path, "data.mdb")):
        return None
    try:
        env = lmdb.open(str(path), readonly=True, max_dbs=len(DATABASES) + 2, lock=True)
    except lmdb.Error as err:
        raise StoreError(f"cannot open LMDB environment at {path}: {err}") from err
    try:
        try:
            db = env.open_db(table.encode(), create=False)
        except lmdb.NotFoundError:
            return None
        with env.begin(db=db) as txn:
            return txn.get(key)
    finally:
        env.close()


def _raise_engine(err: BaseException) -> None:
    """Re-raise an aborted transaction's exception: an LMDB failure (disk, corruption:
    not a bug of ours) as StoreError, anything else as it is."""
    if isinstance(err, lmdb.Error):
        raise StoreError(f"LMDB transaction failed: {err}") from err
    raise err
