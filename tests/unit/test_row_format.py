"""A shard's store opens only in the row layout of rayq.core.storage.layout: a new store
is marked with it, any other is refused with UnknownLayout and left as it was."""

import pytest

from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.codec.wire import encode_messages
from rayq.core.kit.kv import LmdbKV
from rayq.core.storage import layout
from rayq.core.storage.store import open_store
from rayq.core.storage.writes import Put
from rayq.errors import UnknownLayout
from rayq.testing import FakeClock, plenty_of_memory


def opened(path):
    return open_store(path, clock=FakeClock(), memory_probe=plenty_of_memory)


def row_format(path) -> bytes | None:
    kv = LmdbKV(path)
    try:
        return kv.read(lambda txn: txn.get("meta", layout.ROW_FORMAT))
    finally:
        kv.close()


def test_a_new_store_is_marked_with_the_current_row_format_and_reopens(tmp_path):
    store = opened(tmp_path)
    store.run(Put(0, encode_messages([NewMessage(encode_body("hello", 1 << 20), "acme", "report", "k")])))
    store.close()
    assert row_format(tmp_path) == layout.ROW_FORMAT_NOW
    store = opened(tmp_path)
    assert sum(store.counts().values()) == 1
    store.close()


@pytest.mark.parametrize("mark", [b"2", b"4"])  # an older layout, a newer one
def test_a_store_marked_with_another_row_format_is_refused_and_left_as_it_was(tmp_path, mark):
    opened(tmp_path).close()
    kv = LmdbKV(tmp_path)
    kv.transact(lambda txn: txn.put("meta", layout.ROW_FORMAT, mark))
    kv.close()
    with pytest.raises(UnknownLayout, match="format"):
        opened(tmp_path)
    assert row_format(tmp_path) == mark  # and the environment was closed: it reopens


def test_a_store_holding_rows_without_a_row_format_mark_is_refused(tmp_path):
    store = opened(tmp_path)
    store.run(Put(0, encode_messages([NewMessage(encode_body("hello", 1 << 20), "acme", "report", "k")])))
    store.close()
    kv = LmdbKV(tmp_path)
    kv.transact(lambda txn: txn.delete("meta", layout.ROW_FORMAT))
    kv.close()
    with pytest.raises(UnknownLayout):
        opened(tmp_path)
    assert row_format(tmp_path) is None
