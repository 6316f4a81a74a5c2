"""Blobs, size limits and bad input: refused with the documented errors, nothing changed."""

import pytest

from rayq.config import StoreConfig
from rayq.core.codec.model import NewMessage
from rayq.core.codec.wire import encode_messages
from rayq.core.storage.writes import ChangeVisibility, Clear, CollectExpired, Delete, Put, Receive
from rayq.errors import InvalidMessage, MessageTooLarge, ReceiptInvalid, UsageError
from tests.contract.helpers import batch, message, received, starved_of_memory, values

SMALL_BLOBS = StoreConfig(blob_threshold_bytes=1024, blob_chunk_bytes=300,
                          max_message_bytes=4096)
DAY_S = 24 * 3600


def _blob_rows(store) -> list:
    return store.kv.read(lambda txn: list(txn.scan("blobs", b"")))


# The threshold applies to the encoded body: one tag byte more than the value.
@pytest.mark.parametrize("size", [1023, 1024, 1199, 1500, 4096])
@pytest.mark.parametrize("probe", [None, starved_of_memory], ids=["cached", "under-pressure"])
def test_bodies_over_the_blob_threshold_round_trip_and_are_deleted(make_store, size, probe):
    store = make_store(SMALL_BLOBS, **({"memory_probe": probe} if probe else {}))
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    store.run(Put(0, batch(message(body), message(b"small"))))
    assert len(_blob_rows(store)) == (0 if size + 1 <= 1024 else -(-(size + 1) // 300))
    assert values(store.peek(0, 2)) == [body, b"small"]
    got = received(store, 0, 2, 30)
    assert values(got) == [body, b"small"]
    assert store.run(Delete([m.receipt for m in got])) == []
    assert _blob_rows(store) == []


@pytest.mark.parametrize("remove", ["clear", "collect_expired"])
def test_blobs_go_with_their_message_when_it_is_cleared_or_expires(make_store, clock, remove):
    store = make_store(SMALL_BLOBS)
    store.run(Put(0, batch(message(b"x" * 2000, ttl_s=1))))
    clock.advance(1)
    assert (store.run(Clear(0)) if remove == "clear" else store.run(CollectExpired())) == 1
    assert _blob_rows(store) == [] and store.count(0) == 0


def test_a_dead_lettered_blob_keeps_its_body(make_store, clock):
    store = make_store(SMALL_BLOBS)
    store.run(Put(0, batch(message(b"y" * 3000))))
    received(store, 0, 1, 0)
    assert received(store, 0, 1, 30, max_receives=1, dead_letter=1) == []
    assert values(received(store, 1, 1, 30)) == [b"y" * 3000]


@pytest.mark.parametrize("size, fits", [(4096, True), (4097, False)])
def test_a_body_over_max_message_bytes_is_refused_with_message_too_large(make_store, size, fits):
    store = make_store(SMALL_BLOBS)
    big = NewMessage(b"\x00" + b"x" * size, "acme", "report", "k")
    if fits:
        store.run(Put(0, batch(big)))
    else:
        with pytest.raises(MessageTooLarge):
            store.run(Put(0, batch(message("ok"), big)))
    assert store.count(0) == int(fits)


def test_message_too_large_is_an_invalid_message():
    assert issubclass(MessageTooLarge, InvalidMessage)


@pytest.mark.parametrize("key", ["k" * 400, "é" * 200, "😀" * 100],
                         ids=["ascii", "2-byte-chars", "4-byte"])
def test_every_key_of_up_to_400_bytes_is_stored(store, key):
    store.run(Put(0, batch(message("keyed", key=key))))
    assert values(received(store, 0, 1, 30, keys=[key])) == ["keyed"]


@pytest.mark.parametrize("key", ["k" * 401, "😀" * 101, "😀" * 128])
def test_a_key_over_400_bytes_is_an_invalid_message_in_every_store(store, key):
    with pytest.raises(InvalidMessage):
        store.run(Put(0, batch(message("keyed", key=key))))
    assert store.count(0) == 0


GOOD = message("good")


def _with(**fields) -> NewMessage:
    values_ = dict(body=GOOD.body, tenant="acme", type="report", key="k")
    return NewMessage(**{**values_, **fields})


BAD_CALLS = [
    # put: subqueue, buffer, messages and their fields
    ("put", ("0", [GOOD]), InvalidMessage),
    ("put", (-1, [GOOD]), InvalidMessage),
    ("put", (1.0, [GOOD]), InvalidMessage),
    ("put", (True, [GOOD]), InvalidMessage),
    ("put", (2**32, [GOOD]), InvalidMessage),
    ("put", (0, []), InvalidMessage),
    ("put", (0, GOOD), InvalidMessage),
    ("put", (0, iter([GOOD])), InvalidMessage),
    ("put", (0, b"not a put buffer"), InvalidMessage),
    ("put", (0, [GOOD] * 1001), InvalidMessage),
    ("put", (0, [GOOD, b"raw bytes"]), InvalidMessage),
    ("put", (0, [GOOD, _with(body="not bytes")]), InvalidMessage),
    ("put", (0, [GOOD, _with(body=b"")]), InvalidMessage),
    ("put", (0, [GOOD, _with(tenant="")]), InvalidMessage),
    ("put", (0, [GOOD, _with(tenant="line\nbreak")]), InvalidMessage),
    ("put", (0, [GOOD, _with(type=5)]), InvalidMessage),
    ("put", (0, [GOOD, _with(key="k" * 401)]), InvalidMessage),
    ("put", (0, [GOOD, _with(delay_s=-1)]), InvalidMessage),
    ("put", (0, [GOOD, _with(delay_s=7 * DAY_S + 1)]), InvalidMessage),
    ("put", (0, [GOOD, _with(delay_s="5")]), InvalidMessage),
    ("put", (0, [GOOD, _with(ttl_s=0)]), InvalidMessage),
    ("put", (0, [GOOD, _with(ttl_s=True)]), InvalidMessage),
    ("put", (0, [GOOD, _with(ttl_s=float("nan"))]), InvalidMessage),
    ("put", (0, [GOOD, _with(ttl_s=7 * DAY_S + 1)]), InvalidMessage),
    # receive: subqueue, counts, timeouts, listen order, dead-lettering
    ("receive", ("0", 1, 30), InvalidMessage),
    ("receive", (0, 0, 30), InvalidMessage),
    ("receive", (0, 1001, 30), InvalidMessage),
    ("receive", (0, 1.5, 30), InvalidMessage),
    ("receive", (0, True, 30), InvalidMessage),
    ("receive", (0, 1, -1), InvalidMessage),
    ("receive", (0, 1, 12 * 3600 + 0.001), InvalidMessage),
    ("receive", (0, 1, "30"), InvalidMessage),
    ("receive", (0, 1, float("inf")), InvalidMessage),
    ("receive", (0, 1, float("nan")), InvalidMessage),
    ("receive", (0, 1, 30, "k"), InvalidMessage),
    ("receive", (0, 1, 30, [1]), InvalidMessage),
    ("receive", (0, 1, 30, None, 0, 1), InvalidMessage),
    ("receive", (0, 1, 30, None, 2, None), InvalidMessage),
    ("receive", (0, 1, 30, None, 2, -1), InvalidMessage),
    # the others
    ("delete", ("a receipt",), InvalidMessage),
    ("delete", (["x"] * 1001,), InvalidMessage),
    ("change_visibility", ("x" * 44, -1), InvalidMessage),
    ("change_visibility", ("x" * 44, 12 * 3600 + 1), InvalidMessage),
    ("change_visibility", ("x" * 44, 10), ReceiptInvalid),
    ("peek", (-1, 1), InvalidMessage),
    ("peek", (0, 0), InvalidMessage),
    ("clear", ("0",), InvalidMessage),
    ("collect_expired", (0,), InvalidMessage),
]


WRITES = {"receive": Receive, "delete": Delete, "change_visibility": ChangeVisibility,
          "clear": Clear, "collect_expired": CollectExpired}


def _call(store, name, args):
    if name == "put":  # a list of messages goes as a client sends it: one put buffer
        subqueue, sent = args
        return store.run(Put(subqueue, encode_messages(sent) if isinstance(sent, list) else sent))
    if name == "receive" and len(args) > 3:
        keys, max_receives, dead_letter = (args[3:] + (None, None))[:3]
        return store.run(Receive(*args[:3], keys=keys, max_receives=max_receives,
                                 dead_letter=dead_letter))
    if name == "peek":
        return store.peek(*args)
    return store.run(WRITES[name](*args))


def _snapshot(store):
    return store.counts(), [(m.id, m.body, m.dequeue_count) for m in store.peek(0, 10)]


@pytest.mark.parametrize("name, args, error", BAD_CALLS,
                         ids=[f"{n}{i}" for i, (n, _, _) in enumerate(BAD_CALLS)])
def test_bad_input_raises_a_usage_error_and_changes_nothing(store, clock, name, args, error):
    store.run(Put(0, batch(*[message("visible", key=k) for k in "ab"] + [message("hidden")])))
    [hidden] = received(store, 0, 1, 30, keys=["k"])
    before, stats = _snapshot(store), store.stats()
    with pytest.raises(error) as raised:
        _call(store, name, args)
    assert isinstance(raised.value, UsageError)
    assert _snapshot(store) == before
    assert (store.stats().puts, store.stats().receives) == (stats.puts, stats.receives)
    assert store.enqueue_counts() == {(0, "report", "acme"): [0.0] * 9 + [3.0]}
    assert store.run(Delete([hidden.receipt])) == []
