"""What crosses Ray between clients and shards: one msgpack buffer per batch.

A put is ``[version, attributes, refs, bodies]``: the distinct attribute tuples
(tenant, type, fairness key, delay µs, ttl µs or None, task) of the batch, one
index into them per message, and the encoded bodies; a put of tasks adds a fifth
element, each task's id (``[..., bodies, task ids]``). The shard validates each
attribute tuple once, not once per message, and writes ``prefix + body`` rows.

A receive answers ``[[id, receipt, body, tenant, type, key, dequeue count,
enqueued_at µs, subqueue, first received µs], ...]``. Both are packed and unpacked in C; Ray moves
one bytes object instead of pickling hundreds of Python objects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgpack

from rayq.config import MAX_BODY_BYTES
from rayq.core.codec.task_ids import check_task_id
from rayq.core.codec.model import (MAX_BATCH, NewMessage, Received, StoredMessage, US, at_s,
                                   check_key, check_name, check_priority, check_seconds,
                                   decode_body, to_us)

Entry = tuple["Attrs", bytes]  # one message on its way: attributes and encoded body
from rayq.errors import InvalidMessage, MessageTooLarge

PUT_VERSION = 1
# a body over its limit is MessageTooLarge, told after the unpack: bins up to any limit pass
_LIMITS = dict(max_str_len=16 << 20, max_bin_len=MAX_BODY_BYTES + 1, max_array_len=1 << 20,
               max_map_len=0, max_ext_len=0)


class Attrs(NamedTuple):
    """What the messages of a put share, besides their enqueue time."""

    tenant: str
    type: str
    key: str
    delay_us: int = 0
    ttl_us: int | None = None
    task: bool = False
    priority: int = 0  # 0..MAX_PRIORITY: higher runs first among its key's ready messages


class PutBatch(NamedTuple):
    """A decoded, validated put: ``attrs[refs[i]]`` are the attributes of ``bodies[i]``."""

    attrs: list[Attrs]
    refs: list[int]
    bodies: list[bytes]
    task_ids: list[str | None] | None = None  # a put of tasks: one id (or None) each


def attrs_of(m: NewMessage) -> Attrs:
    """A message's attributes for the wire; numbers are checked here, the rest (ranges,
    names) by the shard. Raises InvalidMessage."""
    if not isinstance(m, NewMessage):
        raise InvalidMessage("put takes NewMessage values")
    check_seconds(m.delay_s, "delay_s", 0, math.inf)
    if m.ttl_s is not None:
        check_seconds(m.ttl_s, "ttl_s", 0, math.inf)
    return Attrs(m.tenant, m.type, m.key, to_us(m.delay_s),
                 None if m.ttl_s is None else to_us(m.ttl_s), bool(m.task),
                 check_priority(m.priority))


def encode_put(entries: Iterable[Entry | tuple[Attrs, bytes, str]]) -> bytes:
    """Pack (attributes, encoded body) pairs into one put buffer; a task's entry may add
    its id as a third element."""
    table: dict[Attrs, int] = {}
    refs, bodies, task_ids = [], [], []
    for attrs, body, *task_id in entries:
        index = table.get(attrs)
        if index is None:
            index = table[attrs] = len(table)
        refs.append(index)
        bodies.append(body)
        task_ids.append(task_id[0] if task_id else None)
    parts = [PUT_VERSION, list(table), refs, bodies]
    if any(task_id is not None for task_id in task_ids):
        parts.append(task_ids)
    return msgpack.packb(parts, use_bin_type=True)


def encode_messages(messages: Sequence[NewMessage]) -> bytes:
    """A put buffer of :class:`NewMessage` values (tests and tools)."""
    return encode_put((attrs_of(m), m.body) for m in messages)


def decode_put(data: Any, *, max_message_bytes: int, max_delay_s: float,
               max_ttl_s: float, max_task_bytes: int | None = None) -> PutBatch:
    """Unpack and validate a put buffer: a task's body is at most ``max_task_bytes``
    (None: ``max_message_bytes``), any other at most ``max_message_bytes``. Raises
    InvalidMessage or MessageTooLarge."""
    if not isinstance(data, bytes):
        raise InvalidMessage("put takes a batch buffer (bytes) made by rayq.core.codec.wire")
    max_task_bytes = max_message_bytes if max_task_bytes is None else max_task_bytes
    try:
        version, raw_attrs, refs, bodies, *task_ids = msgpack.unpackb(data, raw=False, **_LIMITS)
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData) as err:
        raise InvalidMessage(f"malformed put batch: {err}") from err
    if version != PUT_VERSION or not isinstance(raw_attrs, list) or not raw_attrs:
        raise InvalidMessage("malformed put batch: version or attributes")
    if not isinstance(refs, list) or not isinstance(bodies, list) \
            or not 1 <= len(bodies) <= MAX_BATCH or len(refs) != len(bodies):
        raise InvalidMessage(f"put takes 1 to {MAX_BATCH} messages")
    attrs = [_check_attrs(a, max_delay_s, max_ttl_s) for a in raw_attrs]
    if set(map(type, refs)) != {int} or min(refs) < 0 or max(refs) >= len(attrs):
        raise InvalidMessage("malformed put batch: attribute references")
    if set(map(type, bodies)) != {bytes} or min(map(len, bodies)) < 1:
        raise InvalidMessage("put takes encoded, non-empty bytes bodies")
    _check_sizes(attrs, refs, bodies, max_message_bytes, max_task_bytes)
    return PutBatch(attrs, refs, bodies, _check_task_ids(task_ids, attrs, refs))


def _check_sizes(attrs: list[Attrs], refs: list[int], bodies: list[bytes],
                 max_message_bytes: int, max_task_bytes: int) -> None:
    """MessageTooLarge for a body over its limit (less the body's type tag): a task's
    ``max_task_bytes``, another message's ``max_message_bytes``."""
    largest = max(map(len, bodies)) - 1
    if largest <= min(max_message_bytes, max_task_bytes):
        return  # the usual put: no body near either limit
    for ref, body in zip(refs, bodies):
        limit = max_task_bytes if attrs[ref].task else max_message_bytes
        if len(body) - 1 > limit:
            raise MessageTooLarge(f"body is {len(body) - 1} bytes; the limit is {limit}")


def _check_task_ids(given: list, attrs: list[Attrs], refs: list[int]) -> list | None:
    """The put's task ids (one per message, None for a message without), or None when it
    has none. Only tasks carry ids."""
    if not given:
        return None
    if len(given) != 1 or not isinstance(given[0], list) or len(given[0]) != len(refs):
        raise InvalidMessage("malformed put batch: one task id per message")
    ids = given[0]
    if any(task_id is not None and not attrs[ref].task for ref, task_id in zip(refs, ids)):
        raise InvalidMessage("only tasks carry task ids")
    return [None if task_id is None else check_task_id(task_id) for task_id in ids]


def _check_attrs(raw: Any, max_delay_s: float, max_ttl_s: float) -> Attrs:
    if not isinstance(raw, list) or len(raw) != 7:
        raise InvalidMessage("malformed put batch: an attribute entry")
    tenant, type_, key, delay_us, ttl_us, task, priority = raw
    check_name(tenant, "tenant")
    check_name(type_, "type")
    check_key(key)
    if type(delay_us) is not int or not 0 <= delay_us <= to_us(max_delay_s):
        raise InvalidMessage(f"delay_s must be within [0, {max_delay_s}] seconds")
    if ttl_us is not None and (type(ttl_us) is not int or not 1000 <= ttl_us <= to_us(max_ttl_s)):
        raise InvalidMessage(f"ttl_s must be within [0.001, {max_ttl_s}] seconds")
    if type(task) is not bool:
        raise InvalidMessage("malformed put batch: the task flag")
    return Attrs(tenant, type_, key, delay_us, ttl_us, task, check_priority(priority))


def put_count(data: Any) -> int:
    """How many messages a put buffer carries, read from its headers (the bodies are
    skipped, not decoded); 0 for anything malformed (decode_put refuses it later)."""
    if not isinstance(data, bytes):
        return 0
    unpacker = msgpack.Unpacker(max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    try:
        if unpacker.read_array_header() not in (4, 5):
            return 0
        unpacker.skip()  # version
        unpacker.skip()  # the attribute table
        return unpacker.read_array_header()  # one ref per message
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData):
        return 0


# -- receives -------------------------------------------------------------------------
def encode_delivered(rows: list[list]) -> bytes:
    """Pack delivered messages: each [id, receipt, body, tenant, type, key,
    dequeue count, enqueued_at µs, subqueue, first received µs]."""
    return msgpack.packb(rows, use_bin_type=True)


def delivered_count(data: bytes) -> int:
    """How many messages a receive's answer holds, from its msgpack array header."""
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    return int.from_bytes(data[1:3] if first == 0xDC else data[1:5], "big")


def _array_header_size(data: bytes) -> int:
    first = data[0]
    return 1 if 0x90 <= first <= 0x9F else 3 if first == 0xDC else 5


def join_delivered(parts: Sequence[bytes]) -> bytes:
    """One receive answer holding the messages of several, in order (a receive that went
    on through a shard's subqueues): the arrays' items are copied, never decoded."""
    if len(parts) == 1:
        return parts[0]
    head = msgpack.Packer().pack_array_header(sum(map(delivered_count, parts)))
    return head + b"".join(p[_array_header_size(p):] for p in parts)


def decode_received(data: bytes) -> list[Received]:
    """The messages of a receive's answer as users get them (bodies decoded)."""
    return [Received(mid, receipt, decode_body(body), tenant, type_, dequeues, enqueued / US,
                     at_s(first))
            for mid, receipt, body, tenant, type_, _, dequeues, enqueued, _, first
            in _unpack_delivered(data)]


def _unpack_delivered(data: bytes) -> list:
    return msgpack.unpackb(data, raw=False, max_str_len=1 << 20, max_bin_len=MAX_BODY_BYTES + 1,
                           max_array_len=1 << 20, max_map_len=0, max_ext_len=0)


def decode_delivered(data: bytes) -> list[StoredMessage]:
    """The messages of a receive's answer, as :class:`StoredMessage` values."""
    rows = _unpack_delivered(data)
    return [StoredMessage(mid, receipt, body, tenant, type_, key, dequeues, enqueued / US, sq,
                          at_s(first))
            for mid, receipt, body, tenant, type_, key, dequeues, enqueued, sq, first in rows]

