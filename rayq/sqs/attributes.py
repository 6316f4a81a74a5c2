"""Queue attributes: the per-queue settings SQS keeps that rayq's registry does not
(default visibility timeout, retention, delay, wait time, size limit, redrive policy,
FIFO settings, access policy, encryption settings, tags), their SQS names, ranges and
string forms. Pure: the endpoint persists :class:`Settings`.

Policy and the encryption attributes are kept and returned, not enforced: rayq's own
gates decide who reaches a queue, and LMDB stores messages as they came.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from rayq.sqs.errors import SqsError, invalid

DAY_S = 86_400
# name -> (Settings field, lowest, highest)
SETTABLE = {
    "VisibilityTimeout": ("visibility_timeout_s", 0, 43_200),
    "MessageRetentionPeriod": ("retention_s", 60, 14 * DAY_S),
    "DelaySeconds": ("delay_s", 0, 900),
    "ReceiveMessageWaitTimeSeconds": ("wait_s", 0, 20),
    "MaximumMessageSize": ("max_message_bytes", 1024, 1_048_576),
}
REDRIVE = "RedrivePolicy"
REDRIVE_ALLOW = "RedriveAllowPolicy"
POLICY = "Policy"
FIFO = "FifoQueue"
CONTENT_DEDUP = "ContentBasedDeduplication"
# Attributes kept as the strings they were given: name -> (allowed values or None, default).
# FIFO-only ones (and FifoQueue) show on FIFO queues only.
TEXTS = {
    POLICY: (None, None),
    "KmsMasterKeyId": (None, None),
    "KmsDataKeyReusePeriodSeconds": (None, "300"),
    "SqsManagedSseEnabled": (("true", "false"), "true"),
    REDRIVE_ALLOW: (None, None),
    CONTENT_DEDUP: (("true", "false"), "false"),
    "DeduplicationScope": (("messageGroup", "queue"), "queue"),
    "FifoThroughputLimit": (("perQueue", "perMessageGroupId"), "perQueue"),
}
FIFO_ONLY = (CONTENT_DEDUP, "DeduplicationScope", "FifoThroughputLimit")
COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed")
READ_ONLY = COUNTS + ("CreatedTimestamp", "LastModifiedTimestamp", "QueueArn")
READABLE = tuple(SETTABLE) + READ_ONLY + (REDRIVE, FIFO) + tuple(TEXTS)
MAX_TAGS = 50


@dataclass(frozen=True)
class Settings:
    """A queue's SQS settings (defaults as SQS's); times in seconds since the epoch.
    ``redrive`` is the RedrivePolicy JSON ("" for none); ``texts`` the attributes kept as
    strings; ``purged_at`` the last PurgeQueue."""

    visibility_timeout_s: int = 30
    retention_s: int = 345_600
    delay_s: int = 0
    wait_s: int = 0
    max_message_bytes: int = 1_048_576
    modified_at: float = 0.0
    fifo: bool = False
    redrive: str = ""
    texts: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    purged_at: float = 0.0

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict | None) -> "Settings":
        if not record:
            return cls()
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in record.items() if k in known}
        for pairs in ("texts", "tags"):
            values[pairs] = tuple(tuple(p) for p in values.get(pairs, ()))
        return cls(**values)

    def text(self, name: str) -> str | None:
        return dict(self.texts).get(name)

    def render(self) -> dict[str, str]:
        """Every stored attribute by its SQS name (defaults included)."""
        out = {name: str(getattr(self, field)) for name, (field, _, _) in SETTABLE.items()}
        kept = dict(self.texts)
        for name, (_, default) in TEXTS.items():
            value = kept.get(name, default)
            if value is not None and (self.fifo or name not in FIFO_ONLY):
                out[name] = value
        if "KmsMasterKeyId" not in kept:
            out.pop("KmsDataKeyReusePeriodSeconds", None)
        if self.fifo:
            out[FIFO] = "true"
        if self.redrive:
            out[REDRIVE] = self.redrive
        return out

    def differs_from(self, other: "Settings") -> str | None:
        """The first attribute whose value differs between the two, or None."""
        mine, theirs = self.render(), other.render()
        return next((n for n in sorted(set(mine) | set(theirs)) if mine.get(n) != theirs.get(n)),
                    None)


def unsupported_attribute(name: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name!s:.80}.")


def check_names(names: Any, known: tuple[str, ...] = READABLE) -> list[str]:
    """The attribute names a call asks for, each one of ``known`` ("All" expands to all)."""
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid("AttributeNames must be a list of strings.")
    if "All" in names:
        return list(known)
    for name in names:
        if name not in known:
            raise unsupported_attribute(name)
    return list(dict.fromkeys(names))


def parse(attributes: Any, base: Settings, now: float, creating: bool) -> Settings:
    """Apply SQS attribute strings to ``base``. Raises InvalidAttributeName for a name SQS
    does not have (or one only CreateQueue sets), InvalidAttributeValue for a value out
    of range."""
    if attributes is None:
        return base
    if not isinstance(attributes, dict):
        raise invalid("Attributes must be a map of attribute names to strings.")
    values: dict[str, Any] = {}
    texts = dict(base.texts)
    for name, value in attributes.items():
        if not isinstance(value, str):
            raise bad_value(name)
        if name in SETTABLE:
            field, low, high = SETTABLE[name]
            values[field] = _int_in(name, value, low, high)
        elif name == REDRIVE:
            values["redrive"] = redrive_policy(value)
        elif name == FIFO:
            if not creating:
                raise SqsError("InvalidAttributeName", f"Attribute {name} is read-only.")
            values["fifo"] = _bool(name, value)
        elif name in TEXTS:
            _set_text(texts, name, value)
        elif name in READ_ONLY:
            raise SqsError("InvalidAttributeName", f"Attribute {name} is read-only.")
        else:
            raise unsupported_attribute(name)
    values["texts"] = tuple(sorted(texts.items()))
    settings = replace(base, **values)
    if not settings.fifo and any(name in texts for name in FIFO_ONLY):
        raise unsupported_attribute(next(n for n in FIFO_ONLY if n in texts))
    return replace(settings, modified_at=now) if settings != base else base


def _set_text(texts: dict, name: str, value: str) -> None:
    allowed, _ = TEXTS[name]
    if allowed is not None and value not in allowed:
        raise bad_value(name)
    if name == "KmsDataKeyReusePeriodSeconds":
        _int_in(name, value, 60, DAY_S)
    if name in (POLICY, REDRIVE_ALLOW) and value:
        _json_object(name, value)
        if name == REDRIVE_ALLOW:
            _check_redrive_allow(json.loads(value))
    if value == "" and allowed is None:
        texts.pop(name, None)
    else:
        texts[name] = value


def _check_redrive_allow(policy: dict) -> None:
    permission = policy.get("redrivePermission")
    if permission not in ("allowAll", "denyAll", "byQueue"):
        raise bad_value(REDRIVE_ALLOW)
    sources = policy.get("sourceQueueArns")
    if permission == "byQueue" and (not isinstance(sources, list) or not 1 <= len(sources) <= 10):
        raise bad_value(REDRIVE_ALLOW)
    if permission != "byQueue" and sources:
        raise bad_value(REDRIVE_ALLOW)


def _bool(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise bad_value(name)
    return value.lower() == "true"


def _int_in(name: str, value: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d{1,10}", value) or not low <= int(value) <= high:
        raise bad_value(name)
    return int(value)


def bad_value(name: str, reason: str = "") -> SqsError:
    """SQS's InvalidAttributeValue (the reason, when given, as SQS appends it)."""
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}."
                    + (f" Reason: {reason}" if reason else ""))


def _json_object(name: str, value: str) -> dict:
    try:
        policy = json.loads(value)
    except ValueError:
        raise bad_value(name) from None
    if not isinstance(policy, dict):
        raise bad_value(name)
    return policy


def redrive_policy(value: str) -> str:
    """A RedrivePolicy, normalised ("" removes it): deadLetterTargetArn and maxReceiveCount
    from 1 to 1000. Whether the target exists is the caller's to check."""
    if value == "" or value.strip() == "{}":
        return ""
    policy = _json_object(REDRIVE, value)
    count = policy.get("maxReceiveCount")
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise bad_value(REDRIVE, "Invalid value for maxReceiveCount: "
                                 f"{policy.get('maxReceiveCount')}, valid values are from 1 "
                                 "to 1000 both inclusive.")
    target = policy.get("deadLetterTargetArn")
    if not isinstance(target, str) or not target:
        raise bad_value(REDRIVE, "Redrive policy does not contain deadLetterTargetArn")
    return json.dumps({"deadLetterTargetArn": target, "maxReceiveCount": count})


def redrive_target(settings: Settings) -> tuple[str, int] | None:
    """(deadLetterTargetArn, maxReceiveCount) of a queue with a redrive policy."""
    return _redrive(settings.redrive) if settings.redrive else None


@functools.lru_cache(maxsize=1024)
def _redrive(policy_json: str) -> tuple[str, int]:
    """A RedrivePolicy read once per text (every receive of the queue asks)."""
    policy = json.loads(policy_json)
    return policy["deadLetterTargetArn"], policy["maxReceiveCount"]


def redrive_allows(settings: Settings, source_arn: str) -> bool:
    """Whether a queue's RedriveAllowPolicy lets ``source_arn`` dead-letter into it."""
    text = settings.text(REDRIVE_ALLOW)
    if not text:
        return True
    policy = json.loads(text)
    permission = policy.get("redrivePermission")
    return permission == "allowAll" or (
        permission == "byQueue" and source_arn in policy.get("sourceQueueArns", ()))
