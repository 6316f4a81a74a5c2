"""The ordered key-value layer under a shard: LMDB, durable by default.

The queue logic in :mod:`rayq.core.storage.store` sees only :class:`Txn` (get, put,
delete, ordered scan, nested transaction); :mod:`rayq.testing` provides the
same over plain dicts. Transactions are context managers that abort on error.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import lmdb

from rayq.core.kit.private import FILE_MODE, make_private_dir
from rayq.errors import StoreError

T = TypeVar("T")
DATABASES = ("rows", "expiry", "blobs", "counts", "keys", "meta", "outcomes", "outcome_expiry",
             "spill", "tcounts", "nonces")


class Txn(Protocol):
    def get(self, db: str, key: bytes) -> bytes | None: ...
    def put(self, db: str, key: bytes, value: bytes) -> None: ...
    def delete(self, db: str, key: bytes) -> bool: ...
    def putmulti(self, db: str, items: list[tuple[bytes, bytes]]) -> None: ...
    def scan(self, db: str, start: bytes, stop: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...
    def scan_keys(self, db: str, start: bytes, stop: bytes | None = None) -> Iterator[bytes]: ...
    def nested(self) -> contextlib.AbstractContextManager["Txn"]: ...


class KV(Protocol):
    def transact(self, fn: Callable[[Txn], T]) -> T: ...
    def read(self, fn: Callable[[Txn], T]) -> T: ...
    def info(self) -> dict[str, int]: ...
    def close(self) -> None: ...


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


class LmdbKV:
    """One LMDB environment: named sub-databases, fsync on commit, growing map."""

    def __init__(self, path: str | os.PathLike, *, map_size: int = 256 << 20,
                 durable: bool = True):
        make_private_dir(path)
        try:
            self.env = lmdb.open(str(path), map_size=map_size, max_dbs=len(DATABASES) + 2,
                                 sync=durable, metasync=durable, writemap=False,
                                 max_readers=256, lock=True, mode=FILE_MODE)
        except lmdb.Error as err:
            raise StoreError(f"cannot open LMDB environment at {path}: {err}") from err
        self.env.reader_check()  # clear reader slots left by crashed processes
        self._dbs = {name: self.env.open_db(name.encode()) for name in DATABASES}

    def transact(self, fn: Callable[[Txn], T]) -> T:
        """Run ``fn`` in one write transaction (one commit, one fsync); grow the map when full."""
        while True:
            txn = self.env.begin(write=True)
            try:
                result = fn(self._wrap(txn))
                txn.commit()
                return result
            except lmdb.MapFullError:
                txn.abort()
                self._grow()
            except lmdb.Error as err:  # the engine failed (disk, corruption): not a bug of ours
                txn.abort()
                raise StoreError(f"LMDB transaction failed: {err}") from err
            except BaseException:
                txn.abort()
                raise

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
