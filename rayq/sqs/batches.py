"""Batch requests: entry lists of 1 to 10 with distinct, well-formed ids, and the
per-entry failures SQS answers with."""

from __future__ import annotations

import re
from typing import Any

from rayq.sqs.errors import SqsError, missing

MAX_ENTRIES = 10
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def check_entries(params: dict, kind: str = "SendMessageBatch") -> list[dict]:
    """A batch's entries. Raises EmptyBatchRequest, TooManyEntriesInBatchRequest,
    InvalidBatchEntryId or BatchEntryIdsNotDistinct; ``kind`` names the action in
    SQS's wording of EmptyBatchRequest."""
    entries: Any = params.get("Entries")
    if entries is None:
        raise missing("Entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", "Entries must be a list of objects.")
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {kind}RequestEntry "
                                             "in the request.")
    if len(entries) > MAX_ENTRIES:
        raise SqsError("TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {MAX_ENTRIES}. You have "
                       f"sent {len(entries)}.")
    ids = [e.get("Id") for e in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain "
                           "alphanumeric characters, hyphens and underscores. It can be at "
                           "most 80 letters long.")
    seen: set[str] = set()
    for entry_id in ids:
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def failure(entry_id: str, err: SqsError) -> dict:
    return {"Id": entry_id, "SenderFault": err.sender, "Code": err.code, "Message": err.message}
