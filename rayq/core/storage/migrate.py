"""Opening a shard written by an older rayq: rows move to the current layout once.

Format 1 (rayq up to the data-plane rebuild) stored each row as a msgpack tuple
(id, tenant, type, enqueued_at µs, expires_at µs, dequeue count, nonce, inline
body or None, blob reference or None, task). Format 2 is :mod:`rayq.core.storage.layout`.
Rows and spilled messages are rewritten in the transaction that opens the shard,
so a shard is either wholly in one format or wholly in the other. Receipts handed
out before the upgrade stay valid: the nonce is kept.
"""

from __future__ import annotations

import msgpack

from rayq.core.storage import layout as rows
from rayq.core.kit.kv import Txn

_SPILL_HEAD_BYTES = rows.SPILL_HEAD.size  # the same in both formats


def migrate_rows(txn: Txn, store_id: bytes) -> int:
    """Bring every row of the shard to the current format; returns how many changed."""
    if txn.get("meta", rows.ROW_FORMAT) == rows.ROW_FORMAT_NOW:
        return 0
    changed = [(key, v2_value(value)) for key, value in txn.scan("rows", b"")]
    spilled = [(key, value[:_SPILL_HEAD_BYTES] + v2_value(value[_SPILL_HEAD_BYTES:]))
               for key, value in txn.scan("spill", b"")]
    txn.putmulti("rows", changed)
    txn.putmulti("spill", spilled)
    txn.put("meta", rows.ROW_FORMAT, rows.ROW_FORMAT_NOW)
    return len(changed) + len(spilled)


def v2_value(v1: bytes) -> bytes:
    """A format-1 row value in format 2."""
    (_, tenant, type_, enqueued_us, expires_us, dequeue_count, nonce, body, blob,
     *rest) = msgpack.unpackb(v1, raw=False, use_list=False)
    flags = (rows.TASK if rest and rest[0] else 0) | (rows.BLOB if blob is not None else 0)
    head = rows.prefix(enqueued_us, expires_us, flags, tenant.encode(), type_.encode())
    head = rows.redelivered(head, dequeue_count, nonce or rows.NO_NONCE)
    return head + (rows.blob_ref_value(*blob) if blob is not None else body)
