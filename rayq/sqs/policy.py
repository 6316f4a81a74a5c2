"""Queue tags and the access policy AddPermission and RemovePermission edit (pure).

The policy is kept and returned as SQS writes it; it is not enforced (rayq's gates
decide who reaches a queue: its owner and the ``default`` account).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rayq.sqs.attributes import MAX_TAGS
from rayq.sqs.errors import invalid, missing

_TAG_KEY = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")
ACTIONS = ("*", "SendMessage", "ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility",
           "GetQueueAttributes", "GetQueueUrl", "ListDeadLetterSourceQueues",
           "PurgeQueue", "ListQueueTags")


def tagged(tags: tuple[tuple[str, str], ...], new: Any, queue: str) -> tuple[tuple[str, str], ...]:
    """``tags`` with ``new`` (a map of key to value) added. Raises InvalidParameterValue."""
    if new is None:
        raise missing("Tags")
    if not isinstance(new, dict) or not new:
        raise invalid("The request must contain a non-empty map of Tags.")
    for key, value in new.items():
        if not isinstance(key, str) or not _TAG_KEY.match(key) or key.startswith("aws:"):
            raise invalid("Tag keys must be between 1 and 128 characters in length.")
        if not isinstance(value, str) or len(value) > 256:
            raise invalid("Tag values must be between 0 and 256 characters in length.")
    merged = dict(tags) | new
    if len(merged) > MAX_TAGS:
        raise invalid(f"Too many tags added for queue {queue}.")
    return tuple(sorted(merged.items()))


def untagged(tags: tuple[tuple[str, str], ...], keys: Any) -> tuple[tuple[str, str], ...]:
    if keys is None:
        raise missing("TagKeys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise invalid("TagKeys must be a non-empty list of strings.")
    return tuple((k, v) for k, v in tags if k not in keys)


def with_permission(policy: str | None, queue_arn: str, p: dict) -> str:
    """The Policy JSON with AddPermission's statement ``Label`` added. Raises
    InvalidParameterValue (the label exists, an action is unknown) or MissingParameter."""
    label = _label(p)
    accounts, actions = p.get("AWSAccountIds"), p.get("Actions")
    for name, value in (("AWSAccountIds", accounts), ("Actions", actions)):
        if not value:
            raise missing(name)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise invalid(f"{name} must be a list of strings.")
    for action in actions:
        if action not in ACTIONS:
            raise invalid(f"Value SQS:{action} for parameter ActionName is invalid. Reason: "
                          "Please refer to the appropriate WSDL for a list of valid actions.")
    document = _document(policy, queue_arn)
    if any(s.get("Sid") == label for s in document["Statement"]):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: Already exists.")
    document["Statement"].append({
        "Sid": label, "Effect": "Allow",
        "Principal": {"AWS": [f"arn:aws:iam::{a}:root" for a in accounts]},
        "Action": [f"SQS:{a}" for a in actions], "Resource": queue_arn})
    return json.dumps(document)


def without_permission(policy: str | None, queue_arn: str, p: dict) -> str:
    """The Policy JSON without statement ``Label`` ("" when none is left). Raises
    InvalidParameterValue when it has no such statement."""
    label = _label(p)
    document = _document(policy, queue_arn)
    kept = [s for s in document["Statement"] if s.get("Sid") != label]
    if len(kept) == len(document["Statement"]):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: can't find label "
                      "on existing policy.")
    return json.dumps(dict(document, Statement=kept)) if kept else ""


def _label(p: dict) -> str:
    label = p.get("Label")
    if label is None:
        raise missing("Label")
    if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", label):
        raise invalid(f"Value {label!s:.80} for parameter Label is invalid.")
    return label


def _document(policy: str | None, queue_arn: str) -> dict:
    document = json.loads(policy) if policy else {}
    document.setdefault("Version", "2012-10-17")
    document.setdefault("Id", f"{queue_arn}/SQSDefaultPolicy")
    statements = document.get("Statement", [])
    document["Statement"] = statements if isinstance(statements, list) else [statements]
    return document
