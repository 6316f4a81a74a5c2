"""Queue attributes: the per-queue settings SQS keeps that rayq's registry does not
(default visibility timeout, retention, delay, wait time, size limit), their SQS
names, ranges and string forms. Pure: the endpoint persists :class:`Settings`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from rayq.sqs.errors import SqsError, invalid

# name -> (Settings field, lowest, highest)
SETTABLE = {
    "VisibilityTimeout": ("visibility_timeout_s", 0, 43_200),
    "MessageRetentionPeriod": ("retention_s", 60, 604_800),   # rayq keeps messages <= 7 days
    "DelaySeconds": ("delay_s", 0, 900),
    "ReceiveMessageWaitTimeSeconds": ("wait_s", 0, 20),
    "MaximumMessageSize": ("max_message_bytes", 1024, 1_048_576),
}
COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed")
READ_ONLY = COUNTS + ("CreatedTimestamp", "LastModifiedTimestamp", "QueueArn")
REDRIVE = "RedrivePolicy"
READABLE = tuple(SETTABLE) + READ_ONLY + (REDRIVE,)
_ARN = re.compile(r"^arn:aws[a-z-]*:sqs:[^:]*:([^:]+):([^:]+)$")


@dataclass(frozen=True)
class Settings:
    """A queue's SQS settings (defaults as SQS's); times in seconds since the epoch."""

    visibility_timeout_s: int = 30
    retention_s: int = 345_600
    delay_s: int = 0
    wait_s: int = 0
    max_message_bytes: int = 1_048_576
    modified_at: float = 0.0

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict | None) -> "Settings":
        return cls(**record) if record else cls()

    def render(self) -> dict[str, str]:
        return {name: str(getattr(self, field)) for name, (field, _, _) in SETTABLE.items()}


def unsupported_attribute(name: str, known: tuple[str, ...] = READABLE) -> SqsError:
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
            raise unsupported_attribute(name, known)
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Change:
    """What CreateQueue or SetQueueAttributes asks for: settings, and max_receives when
    the call carries a RedrivePolicy (0: remove the policy; None: leave it)."""

    settings: Settings
    max_receives: int | None


def parse(attributes: Any, base: Settings, account: str, queue: str, now: float) -> Change:
    """Apply SQS attribute strings to ``base``. Raises InvalidAttributeName for a name rayq
    does not keep, InvalidAttributeValue for a value out of range."""
    if attributes is None:
        return Change(base, None)
    if not isinstance(attributes, dict):
        raise invalid("Attributes must be a map of attribute names to strings.")
    values, max_receives = {}, None
    for name, value in attributes.items():
        if not isinstance(value, str):
            raise _bad_value(name, value)
        if name == REDRIVE:
            max_receives = redrive_receives(value, account, queue)
        elif name in SETTABLE:
            field, low, high = SETTABLE[name]
            values[field] = _int_in(name, value, low, high)
        else:
            raise unsupported_attribute(name) if name not in READ_ONLY else SqsError(
                "InvalidAttributeName", f"Attribute {name} is read-only.")
    settings = replace(base, **values, modified_at=now) if values or max_receives is not None \
        else base
    return Change(settings, max_receives)


def _int_in(name: str, value: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d{1,10}", value) or not low <= int(value) <= high:
        raise _bad_value(name, value, f"must be an integer from {low} to {high}")
    return int(value)


def _bad_value(name: str, value: Any = None, why: str = "") -> SqsError:
    """SQS's InvalidAttributeValue; its message names only the attribute (as SQS's does),
    ``value`` and ``why`` are for the reader of the code."""
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")


def dead_letter_name(queue: str) -> str:
    return queue + "-dlq"


def redrive_receives(value: str, account: str, queue: str) -> int:
    """``maxReceiveCount`` of a RedrivePolicy (0 for ""), which must send dead letters to
    the queue's own ``<name>-dlq``: rayq makes and names each queue's dead-letter queue."""
    if value == "":
        return 0
    try:
        policy = json.loads(value)
    except ValueError:
        raise _bad_value(REDRIVE, value, "must be a JSON object") from None
    if not isinstance(policy, dict):
        raise _bad_value(REDRIVE, value, "must be a JSON object")
    count = policy.get("maxReceiveCount")
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise _bad_value(REDRIVE, value, "needs maxReceiveCount from 1 to 1000")
    target = _ARN.match(str(policy.get("deadLetterTargetArn", "")))
    if target is None or target.groups() != (account, dead_letter_name(queue)):
        raise _bad_value(REDRIVE, value, f"needs deadLetterTargetArn naming this account's "
                                         f"{dead_letter_name(queue)!r}: rayq keeps each "
                                         f"queue's dead letters in <name>-dlq")
    return count


def arn(region: str, account: str, queue: str) -> str:
    return f"arn:aws:sqs:{region}:{account}:{queue}"


def redrive_policy(region: str, account: str, queue: str, max_receives: int) -> str:
    return json.dumps({"deadLetterTargetArn": arn(region, account, dead_letter_name(queue)),
                       "maxReceiveCount": max_receives})
