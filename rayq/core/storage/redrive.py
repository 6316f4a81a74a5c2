"""Redrive: moving dead letters back to the queue they were dead-lettered from
(``client.redrive``; docs/tasks.md, "Redrive").

A dead-lettered message stays on its shard, moved to its queue's DLQ subqueue there with
its seq (:func:`~rayq.core.storage.outcomes.dead_letter_row`). A redrive moves it back on
the same shard into a subqueue of its queue, a bounded batch per transaction: visible at
once, with its receive count, receipt nonce and first receive time reset as a new
message's (SQS's message move task sends each message anew: rayq/sqs/moves.py), and its
id, body, enqueue time, expiry, fairness key, tenant and type kept. A task's recorded
end is forgotten in the same transaction (:func:`~rayq.core.storage.outcomes.revive`),
so it runs again under its id.

Only rows visible at the redrive's start (``until_us``) move: a row a receiver of the DLQ
holds is hidden and stays with its receiver, and one dead-lettered after the start (a
redriven task failing again) waits for the next redrive. Expired rows stay for the
expiry collector.
"""

from __future__ import annotations

import itertools

from rayq.core.codec.model import SubqueueState, check_count, check_name, check_subqueue
from rayq.core.storage import layout
from rayq.core.storage.ledger import Env, Ledger
from rayq.core.storage.outcomes import revive
from rayq.core.storage.spill import check_target
from rayq.errors import InvalidMessage, QueueDisabled

MAX_US = 2**64 - 1


def redrive(w: Ledger, env: Env, source: int, target: int, limit: int,
            type_: str | None = None, until_us: int | None = None,
            after: bytes | None = None) -> tuple[int, int, bytes | None]:
    """Move the rows of subqueue ``source`` (a DLQ's) visible at ``until_us`` (None: now)
    into subqueue ``target``, only those of ``type_`` when given, looking at up to
    ``limit`` rows after ``after``. Returns (moved, the ``until_us`` used, where to go on
    from: None when ``source`` has no more rows). Raises InvalidMessage for bad fields,
    QueueDisabled when ``target`` takes no messages (retired, disabled or removed)."""
    check_subqueue(source)
    check_subqueue(target)
    check_count(limit, "limit", 1, 100_000)
    if type_ is not None:
        check_name(type_, "type")
    if until_us is not None:
        check_count(until_us, "until_us", 0, MAX_US)
    if after is not None and (not isinstance(after, bytes) or len(after) != layout.ROW_KEY.size
                              or layout.parse_row_key(after)[0] != source):
        raise InvalidMessage("after must be None or a row key that redrive returned")
    if source == target:
        raise InvalidMessage("a redrive moves messages to another subqueue than its source")
    check_target(w, target)
    if w.index.state(target) is not SubqueueState.ALL:
        raise QueueDisabled(f"subqueue {target} does not accept messages")
    until = w.now_us if until_us is None else min(until_us, w.now_us)
    if source in w.index.purging:  # cleared since the caller looked: nothing to move
        return 0, until, None
    start, stop = layout.subqueue_range(source)
    start = layout.key_after(after) if after else start
    found = list(itertools.islice(w.txn.scan("rows", start, stop), limit))
    moved = 0
    for row_key, value in found:
        meta = layout.meta(value)
        if _visible_by(w, row_key, until) and meta.expires_us > w.now_us \
                and (type_ is None or meta.type == type_):
            redrive_row(w, row_key, value, target, meta)
            moved += 1
    w.stats["redriven"] += moved
    return moved, until, None if len(found) < limit else found[-1][0]


def _visible_by(w: Ledger, row_key: bytes, until_us: int) -> bool:
    """Whether a row was visible at ``until_us`` and nobody holds it now (a received row
    of an ordered subqueue keeps its key: its in-flight entry hides it)."""
    sq, kid, visible_us, seq = layout.parse_row_key(row_key)
    if visible_us > until_us:
        return False
    if sq in w.index.ordered:
        hidden = w.txn.get("inflight", layout.inflight_key(sq, kid, seq))
        return hidden is None or layout.unpack_u64(hidden) <= w.now_us
    return True


def redrive_row(w: Ledger, row_key: bytes, value: bytes, target: int,
                meta: layout.RowMeta) -> None:
    """Move one row to ``target``, visible now and never received; a task runs again."""
    fresh = layout.redelivered(value, 0, layout.NO_NONCE, 0)
    w.move_to(row_key, fresh, target, w.now_us, used=False)
    if meta.task:
        revive(w, layout.parse_row_key(row_key)[3])
