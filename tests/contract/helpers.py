"""Small builders shared by the contract tests."""

from rayq.core.storage.cache import MemoryReading
from rayq.core.codec.model import NewMessage, StoredMessage, decode_body, encode_body
from rayq.core.codec.wire import Attrs, attrs_of, decode_delivered, encode_put
from rayq.core.storage.writes import Receive


def batch(*messages: NewMessage, **bad_attrs) -> bytes:
    """A put buffer, as a shard's group commit takes it. ``bad_attrs`` overwrite the
    last message's wire attributes unchecked (to send what a client would refuse)."""
    entries = [(attrs_of(m), m.body) for m in messages]
    if bad_attrs:
        attrs, body = entries[-1]
        entries[-1] = (Attrs(**{**attrs._asdict(), **bad_attrs}), body)
    return encode_put(entries)


def message(value=b"body", *, key="k", tenant="acme", type="report", delay_s=0.0,
            ttl_s=None) -> NewMessage:
    return NewMessage(encode_body(value, 1 << 30), tenant, type, key, delay_s, ttl_s)


def received(store, *args, **kwargs) -> list[StoredMessage]:
    """The messages ``store.run(Receive(*args, **kwargs))`` delivers, decoded."""
    return decode_delivered(store.run(Receive(*args, **kwargs)))


def values(stored) -> list:
    """The decoded bodies of stored messages, in order."""
    return [decode_body(m.body) for m in stored]


def starved_of_memory() -> MemoryReading:
    """A memory probe that always reports pressure: nothing is cached."""
    return MemoryReading(process_rss_bytes=0, available_bytes=0)


def everything(store, subqueue=0, timeout_s=3600.0) -> list:
    """Receive every visible message of a subqueue (hiding them for ``timeout_s``)."""
    out = []
    while batch := received(store, subqueue, 1000, timeout_s):
        out.extend(batch)
    return out
