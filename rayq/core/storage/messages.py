"""The message operations of a shard: put, receive, receipts (delete, change visibility,
defer), expiry and peek, each a function over one transaction's
:class:`~rayq.core.storage.ledger.Ledger`.

Rows are ``(row key, value)`` pairs in the layout of :mod:`rayq.core.storage.layout`;
the hot paths move values as bytes and never decode a body.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

from rayq.core.codec.model import (DEFAULT_ACCOUNT, MAX_BATCH, US, Ending, StoredMessage,
                                   SubqueueState, check_count, check_seconds, check_subqueue,
                                   receipt_text, to_us)
from rayq.core.codec.wire import Attrs, decode_put, encode_delivered
from rayq.core.storage import layout
from rayq.core.storage.ledger import Enqueued, Env, Ledger
from rayq.core.storage.outcomes import (collect_outcomes, dead_letter_row, end_cancelled,
                                       existing, index_task, record_usage)
from rayq.core.storage.picking import Skip, pick
from rayq.core.storage.spill import admit_flooders, diverted, spill_one
from rayq.errors import InvalidMessage, QueueDisabled, ReceiptInvalid


# -- put ---------------------------------------------------------------------------------
class _Group:
    """One attribute group of a put: its key, times, shared row prefixes (inline body,
    blob reference), the flooder it is spilled for (None: not diverted), and its seqs."""

    __slots__ = ("attrs", "kid", "visible_us", "expires_us", "flags", "prefix", "blob_prefix",
                 "flooder", "seqs")

    def __init__(self, w: Ledger, env: Env, attrs: Attrs, flooder: str | None):
        now_us = w.now_us
        ttl_us = to_us(env.config.default_ttl_s) if attrs.ttl_us is None else attrs.ttl_us
        flags = (layout.TASK if attrs.task else 0) | attrs.priority << layout.PRIORITY_AT
        tenant, type_ = attrs.tenant.encode(), attrs.type.encode()
        self.attrs, self.kid = attrs, w.key_id(attrs.key, create=True)
        self.visible_us, self.expires_us = now_us + attrs.delay_us, now_us + ttl_us
        self.flags = flags
        self.prefix = layout.prefix(now_us, self.expires_us, flags, tenant, type_)
        self.blob_prefix = layout.prefix(now_us, self.expires_us, flags | layout.BLOB, tenant, type_)
        self.flooder = flooder
        self.seqs: list[int] = []


def put(w: Ledger, env: Env, subqueue: int, batch: bytes,
        sender: tuple | None = None, account: str = DEFAULT_ACCOUNT) -> list[str]:
    """Store a put buffer (:mod:`rayq.core.codec.wire`); returns the message ids in order.
    A task with an id ``account`` submitted before, whose outcome is still kept, is not
    stored again: its id is the first task's (:mod:`rayq.core.storage.task_index`).
    ``sender`` (account, fairness key mode, task types or None[, whether the account
    owns this plain queue]): refuse messages that account may not send, by the store's
    sender check."""
    check_subqueue(subqueue)
    config = env.config
    decoded = decode_put(batch, max_message_bytes=config.max_message_bytes,
                         max_delay_s=config.max_delay_s, max_ttl_s=config.max_ttl_s,
                         max_task_bytes=config.max_task_bytes)
    if sender is not None:
        if env.check_senders is None:
            raise InvalidMessage("this store checks no senders: put without a sender")
        env.check_senders(sender[0], decoded.attrs, *sender[1:],
                          ordered=subqueue in w.index.ordered)
    if w.index.state(subqueue) is not SubqueueState.ALL:
        raise QueueDisabled(f"subqueue {subqueue} does not accept new messages")
    if subqueue in w.index.ordered and any(attrs.priority for attrs in decoded.attrs):
        raise InvalidMessage("an ordered queue delivers each key's messages in the order "
                             "sent: it takes no priority")
    flooders = [diverted(env, subqueue, attrs.type, attrs.tenant) for attrs in decoded.attrs]
    if any(f is not None for f in flooders):  # throttled or blocked: refused before any write
        counts = [0] * len(flooders)
        for ref in decoded.refs:
            counts[ref] += 1
        admit_flooders(env, subqueue, flooders, [a.type for a in decoded.attrs], counts, w.now_us)
    groups = [_Group(w, env, attrs, flooder) for attrs, flooder in zip(decoded.attrs, flooders)]
    blob_threshold = config.blob_threshold_bytes
    row_items, expiry_items = [], []
    seq = start = w.seq
    seqs = []  # each message's seq: a task id submitted before gives that task's
    for ref, body, task_id in zip(decoded.refs, decoded.bodies,
                                  decoded.task_ids or itertools.repeat(None)):
        group = groups[ref]
        if task_id is not None:
            before = existing(w.txn, account, task_id)
            if before is not None:  # submitted again: the same task, nothing stored
                seqs.append(before)
                continue
        seq += 1
        if len(body) <= blob_threshold:
            value = group.prefix + body
        else:  # the body goes to the blobs table; the row keeps a reference
            value = group.blob_prefix + _write_blob(w, env, seq, body)
        if group.flooder is not None:  # a flooder's new message: to the spill store
            spill_one(w, subqueue, group.kid, group.visible_us, group.attrs.type,
                      group.attrs.tenant, group.flooder, seq, value)
        else:
            row_key = w.placed_key(subqueue, group.kid, group.visible_us, seq, group.flags)
            row_items.append((row_key, value))
            expiry_items.append((layout.expiry_key(group.expires_us, seq), row_key))
        if task_id is not None:
            index_task(w, seq, layout.TaskRecord(
                group.expires_us, w.now_us, 0, 0, 0, account, task_id, group.attrs.tenant,
                group.attrs.type))
        group.seqs.append(seq)
        seqs.append(seq)
    w.seq = seq
    w.put_rows(row_items, expiry_items)
    ids = [w.message_id(s) for s in range(start + 1, seq + 1)]  # the new messages'
    for group in groups:
        _settle_group(w, subqueue, group, ids, start)
    w.stats["puts"] += seq - start
    if len(seqs) == len(ids):
        return ids
    return [ids[s - start - 1] if s > start else w.message_id(s) for s in seqs]


def _settle_group(w: Ledger, sq: int, group: _Group, ids: list[str], start: int) -> None:
    """Counts, events and flights of one attribute group of a put, whose new messages'
    ids are ``ids`` from seq ``start + 1`` on. A put's seqs follow the order sent, so a
    group's need not follow each other (a batch that alternates tenants)."""
    seqs = group.seqs
    if not seqs:
        return
    attrs = group.attrs
    first, last = seqs[0] - start - 1, seqs[-1] - start
    own = ids[first:last] if last - first == len(seqs) else [ids[s - start - 1] for s in seqs]
    w.enqueued.append(Enqueued(w.now_us / US, sq, attrs.type, attrs.tenant, attrs.key, own))
    if group.flooder is None:
        w.count(sq, group.kid, attrs.type, attrs.tenant, len(group.seqs))
        w.joined(sq, group.kid)
    w.sent(sq, group.kid)


def _write_blob(w: Ledger, env: Env, seq: int, body: bytes) -> bytes:
    blob = layout.blob_id(w.index.store_id, seq)
    size = env.config.blob_chunk_bytes
    chunks = range(0, len(body), size)
    for i, offset in enumerate(chunks):
        w.txn.put("blobs", layout.blob_chunk_key(blob, i), body[offset:offset + size])
    return layout.blob_ref_value(blob, len(body), len(chunks))


# -- receive -----------------------------------------------------------------------------
PROMOTE_BATCH = 1000  # hidden rows of priority > 0 a receive moves to their band at most
def receive(w: Ledger, env: Env, subqueue: int, max_messages: int,
            visibility_timeout_s: float | None, *, keys: Sequence[str] | None = None,
            max_receives: int | None = None, dead_letter: int | None = None,
            exclude: Sequence[str] | None = None) -> bytes:
    """Hide and hand out up to ``max_messages`` messages; the answer is a buffer
    (:func:`rayq.core.codec.wire.decode_delivered` reads it)."""
    config = env.config
    check_subqueue(subqueue)
    check_count(max_messages, "max_messages", 1, MAX_BATCH)
    if visibility_timeout_s is None:
        visibility_timeout_s = config.default_visibility_timeout_s
    check_seconds(visibility_timeout_s, "visibility_timeout_s", 0,
                  config.max_visibility_timeout_s)
    _check_keys(keys)
    _check_keys(exclude)
    if max_receives is not None:
        check_count(max_receives, "max_receives", 1, 1000)
        check_subqueue(dead_letter)
    if w.index.state(subqueue) is SubqueueState.DISABLED:
        raise QueueDisabled(f"subqueue {subqueue} is disabled")
    w.promote_due(PROMOTE_BATCH)
    found, skipped = pick(w, env, subqueue, max_messages, w.now_us, keys, max_receives, exclude)
    found = found[:_answer_rows(found)]
    for row_key, value, reason in skipped:
        if reason is Skip.EXPIRED:
            w.remove(row_key, value, Ending.EXPIRED)
            w.stats["expired"] += 1
        elif reason is Skip.CANCELLED:  # its consumer went away before it ended it
            end_cancelled(w, row_key, value)
        else:
            dead_letter_row(w, row_key, value, dead_letter)
    delivered = _deliver(w, env, found, to_us(visibility_timeout_s))
    w.stats["receives"] += len(delivered)
    return encode_delivered(delivered)


MAX_ANSWER_BYTES = 256 << 20  # bodies one receive hands out at most (one always goes)


def _answer_rows(found: list[tuple[bytes, bytes]]) -> int:
    """How many of the rows found, from the first, one answer carries: their bodies
    within MAX_ANSWER_BYTES, so that a few tasks of hundreds of MiB each do not make an
    answer of gigabytes (the rest stay visible for the next receive). Read from the
    rows' headers and blob references: no blob is read. Rows of inline bodies whose
    values add up to less than the cap (the common case) all go, read no further."""
    if not any(layout.flags_of(value) & layout.BLOB for _, value in found) \
            and sum(len(value) for _, value in found) <= MAX_ANSWER_BYTES:
        return len(found)
    total = 0
    for n, (_, value) in enumerate(found):
        meta = layout.meta(value)
        if meta.flags & layout.BLOB:
            total += layout.blob_ref(value, meta.body_at)[1]
        else:
            total += len(value) - meta.body_at
        if total > MAX_ANSWER_BYTES and n:
            return n
    return len(found)


def _deliver(w: Ledger, env: Env, found: list[tuple[bytes, bytes]], hide_us: int) -> list[list]:
    """Hide the rows found and describe each for the receiver; bodies are copied, not decoded."""
    taken = w.take_rows(found, w.now_us + hide_us, os.urandom(8 * len(found)))
    out = []
    cache = env.cache
    for (row_key, value), (new_key, nonce, meta, sq, kid, seq) in zip(found, taken):
        cache.take(row_key)  # a hit: this read came from memory, not LMDB
        out.append([w.message_id(seq), receipt_text(new_key, nonce), w.body_of(value, meta),
                    meta.tenant, meta.type, w.key_name(kid), meta.dequeue_count + 1,
                    meta.enqueued_us, sq, layout.first_received(meta, w.now_us)])
    return out


# -- receipts ----------------------------------------------------------------------------
def delete(w: Ledger, env: Env, receipts: Sequence[str]) -> list[str]:
    """Delete the messages of valid receipts; returns the receipts that were invalid."""
    if not isinstance(receipts, (list, tuple)) or len(receipts) > MAX_BATCH:
        raise InvalidMessage(f"delete takes a list of at most {MAX_BATCH} receipts")
    invalid = []
    for receipt in receipts:
        try:
            row_key, value = w.resolve(receipt)
        except ReceiptInvalid:
            invalid.append(receipt)
            continue
        w.remove(row_key, value, Ending.DELETED)
    w.stats["deletes"] += len(receipts) - len(invalid)
    return invalid


def change_visibility(w: Ledger, env: Env, receipt: str, timeout_s: float,
                      usage: bytes | None = None) -> str:
    """Hide a received message for ``timeout_s`` from now; returns its new receipt.
    ``usage``: the report of the delivery this ends (a task to retry), kept with it."""
    return _hide(w, env, receipt, timeout_s, undeliver=False, usage=usage)


def defer(w: Ledger, env: Env, receipt: str, delay_s: float, usage: bytes | None = None) -> str:
    """Put a received message back unrun for ``delay_s``: its delivery does not count
    toward ``max_receives`` (a consumer declined it, e.g. at a concurrency limit).
    ``usage``: the deferral's report, kept with it."""
    return _hide(w, env, receipt, delay_s, undeliver=True, usage=usage)


def _hide(w: Ledger, env: Env, receipt: str, timeout_s: float, undeliver: bool,
          usage: bytes | None) -> str:
    """A report (``usage``) means the delivery ended: the row rests until its next one,
    or, a task cancelled meanwhile, ends cancelled (its new receipt is then "")."""
    check_seconds(timeout_s, "timeout_s", 0, env.config.max_visibility_timeout_s)
    row_key, value = w.resolve(receipt)
    ended = usage is not None
    if ended and end_cancelled(w, row_key, value):
        new_receipt = ""
    else:
        new_receipt = w.rehide(row_key, value, w.now_us + to_us(timeout_s), undeliver,
                               resting=ended)
    if usage is not None:
        record_usage(w, env, usage)
    return new_receipt


def extend(w: Ledger, env: Env, receipt: str, timeout_s: float) -> tuple[str, bool]:
    """A running task's heartbeat: hide it ``timeout_s`` more from now; (its new
    receipt, whether it was cancelled meanwhile). Raises ReceiptInvalid as
    :func:`change_visibility` does."""
    check_seconds(timeout_s, "timeout_s", 0, env.config.max_visibility_timeout_s)
    row_key, value = w.resolve(receipt)
    cancelled = bool(layout.flags_of(value) & layout.CANCELLING)
    return w.rehide(row_key, value, w.now_us + to_us(timeout_s), False), cancelled


# -- housekeeping ------------------------------------------------------------------------
def collect_expired(w: Ledger, env: Env, limit: int) -> int:
    """Delete up to ``limit`` expired messages and as many expired outcomes."""
    check_count(limit, "limit", 1, 10_000_000)
    entries = list(itertools.islice(w.txn.scan("expiry", b"", layout.expiry_stop(w.now_us)),
                                    limit))
    for expiry_key, row_key in entries:
        value = w.txn.get("rows", row_key)
        if value is None:  # index entry of a row already gone
            w.txn.delete("expiry", expiry_key)
            continue
        w.remove(row_key, value, Ending.EXPIRED)
        w.stats["expired"] += 1
    return len(entries) + collect_outcomes(w, limit) + w.promote_due(PROMOTE_BATCH)


def peek(w: Ledger, env: Env, subqueue: int, max_messages: int,
         keys: Sequence[str] | None) -> list[StoredMessage]:
    """The messages a receive would return, without hiding them (receipt None)."""
    picked, _ = pick(w, env, subqueue, max_messages, w.now_us, keys, None)
    return [w.stored(key, value, None) for key, value in picked]


def _check_keys(keys: Any) -> None:
    if keys is None:
        return
    if not isinstance(keys, (list, tuple)) or not all(isinstance(k, str) for k in keys):
        raise InvalidMessage("keys must be a list of fairness key names")
