"""Messages between SQS's shapes and rayq's: bodies, message attributes and the body
envelope that keeps them, MD5 digests (SDKs check them), system attributes.

rayq's storage keeps a body, a tenant and a type. What else an SQS message carries
(message attributes, AWSTraceHeader, its MessageGroupId when it is not the account,
deduplication id, sequence number, the queue it was dead-lettered from) travels in an
:class:`Envelope`: the stored body becomes a map marked with :data:`MARK`. A message
with none of these is stored as its bare body, so rayq's own clients read it as sent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from decimal import Decimal
from dataclasses import dataclass, field, replace
from typing import Any

from rayq.sqs.attributes import check_names
from rayq.sqs.errors import SqsError, invalid, too_long

TYPE_ATTRIBUTE = "type"
MARK = "rayq.sqs/1"   # the key that marks a stored body as an envelope
MAX_ATTRIBUTES = 10
SYSTEM_ATTRIBUTES = ("SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
                     "SenderId", "MessageGroupId", "MessageDeduplicationId", "SequenceNumber",
                     "AWSTraceHeader", "DeadLetterQueueSourceArn")
TRACE_HEADER = "AWSTraceHeader"
# Characters SQS accepts in a body: #x9 #xA #xD, #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF.
_BAD_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
_DATA_TYPE = re.compile(r"^(String|Number|Binary)(\.[^\s]{1,250})?$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
# SQS's Number: at most 38 significant digits, magnitude from 10^-128 to 10^126.
NUMBER_DIGITS = 38
NUMBER_EXPONENTS = (-128, 126)
_STRING, _BINARY = 1, 2


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def check_body(body: Any, max_bytes: int, extra_bytes: int = 0) -> str:
    """A SendMessage body; ``extra_bytes`` (its attributes) count against ``max_bytes`` with
    it, as in SQS. Raises MissingParameter, InvalidMessageContents, or InvalidParameterValue
    when it is too long."""
    if body is None or body == "":
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if not isinstance(body, str):
        raise invalid("MessageBody must be a string.")
    if _BAD_CHARS.search(body):
        raise SqsError("InvalidMessageContents",
                       "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD "
                       "| #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")
    if len(body.encode("utf-8")) + extra_bytes > max_bytes:
        raise too_long(max_bytes)
    return body


def body_text(body: Any) -> str:
    """A received rayq body as SQS text: str as is, UTF-8 bytes decoded, other bytes in
    base64, any other value (sent by a Python client) as JSON."""
    if isinstance(body, str):
        return body
    if isinstance(body, bytes):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(body).decode("ascii")
    return json.dumps(body, default=repr)


# -- message attributes ------------------------------------------------------------------
def check_attributes(attributes: Any, system: bool = False) -> dict[str, dict]:
    """SendMessage's MessageAttributes (or, with ``system``, MessageSystemAttributes), checked
    as SQS checks them and normalised: each ``{"DataType", "StringValue"}`` or
    ``{"DataType", "BinaryValue": bytes}``. Raises InvalidParameterValue."""
    if attributes is None:
        return {}
    if not isinstance(attributes, dict):
        raise invalid("MessageAttributes must be a map.")
    if len(attributes) > MAX_ATTRIBUTES:
        raise invalid(f"Number of message attributes [{len(attributes)}] exceeds the allowed "
                      f"maximum [{MAX_ATTRIBUTES}].")
    return {name: _check_attribute(name, value, system) for name, value in attributes.items()}


def _check_attribute(name: Any, value: Any, system: bool) -> dict:
    if system and name != TRACE_HEADER:
        raise invalid(f"Message system attribute name '{name!s:.80}' is invalid.")
    if not isinstance(name, str) or not _ATTRIBUTE_NAME.match(name) or ".." in name \
            or name.startswith(".") or name.endswith(".") \
            or (not system and name.lower().startswith(("aws.", "amazon."))):
        raise invalid(f"The message attribute name '{name!s:.80}' is invalid. Attribute name "
                      "can contain A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) "
                      "characters.")
    data_type = value.get("DataType") if isinstance(value, dict) else None
    if not isinstance(data_type, str) or not data_type:
        raise invalid(f"The message attribute '{name}' must contain non-empty message "
                      "attribute type.")
    if not _DATA_TYPE.match(data_type) or len(data_type) > 256:
        raise invalid(f"The type of message (user) attribute '{name}' is invalid. You must use "
                      "only the following supported type prefixes: Binary, Number, String.")
    if data_type.startswith("Binary"):
        return {"DataType": data_type, "BinaryValue": _binary(name, value.get("BinaryValue"))}
    text = value.get("StringValue")
    if not isinstance(text, str) or not text:
        raise invalid(f"The message attribute '{name}' with type '{data_type.split('.')[0]}' "
                      "must use field 'String'.")
    if data_type.startswith("Number"):
        _check_number(name, text)
    if system and data_type != "String":
        raise invalid(f"The message system attribute '{name}' must have DataType String.")
    if _BAD_CHARS.search(text):
        raise SqsError("InvalidMessageContents", f"Invalid characters found in message "
                                                 f"attribute '{name}'.")
    return {"DataType": data_type, "StringValue": text}


def _check_number(name: str, text: str) -> None:
    """Raise SqsError (InvalidParameterValue) unless ``text`` is a number SQS stores."""
    if not _NUMBER.match(text):
        raise invalid(f"Can't cast the value of message (user) attribute '{name}' to a "
                      "number.")
    number = Decimal(text)  # exact: no context rounds a parsed literal
    digits = "".join(map(str, number.as_tuple().digits)).strip("0")
    if len(digits) > NUMBER_DIGITS:
        raise invalid(f"The value of message (user) attribute '{name}' has more than "
                      f"{NUMBER_DIGITS} significant digits.")
    low, high = NUMBER_EXPONENTS
    if digits and not Decimal(f"1e{low}") <= number.copy_abs() <= Decimal(f"1e{high}"):
        raise invalid(f"The value of message (user) attribute '{name}' is outside "
                      f"10^{low} to 10^{high} in magnitude.")


def _binary(name: str, value: Any) -> bytes:
    """A Binary attribute's bytes (base64 in the JSON protocol)."""
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    elif isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"The message attribute '{name}' has a BinaryValue that is not "
                          "base64.") from None
    else:
        raw = b""
    if not raw:
        raise invalid(f"The message attribute '{name}' with type 'Binary' must use field "
                      "'Binary'.")
    return raw


def attributes_bytes(attributes: dict[str, dict]) -> int:
    """What ``attributes`` count against a message's size limit: names, types and values."""
    return sum(len(name.encode()) + len(v["DataType"].encode()) + len(_raw(v))
               for name, v in attributes.items())


def _raw(value: dict) -> bytes:
    return value["BinaryValue"] if "BinaryValue" in value else value["StringValue"].encode()


def message_type(attributes: dict[str, dict]) -> str:
    """The rayq type a message's (checked) attributes carry: a String attribute ``type``,
    or ``default``."""
    value = attributes.get(TYPE_ATTRIBUTE)
    if value is None or not value["DataType"].startswith("String"):
        return "default"
    return value["StringValue"][:128] if value["StringValue"].isprintable() else "default"


def type_attributes(type_: str) -> dict:
    return {TYPE_ATTRIBUTE: {"DataType": "String", "StringValue": type_}}


def attributes_md5(attributes: dict) -> str:
    """MD5OfMessageAttributes, computed as SQS does: per attribute in name order, each of
    name, data type and value prefixed by its 4-byte big-endian length, with a
    transport-type byte (1 String/Number, 2 Binary) before the value."""
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        for part in (name.encode(), value["DataType"].encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        if "StringValue" in value:
            raw, transport = value["StringValue"].encode(), _STRING
        else:
            raw = value["BinaryValue"]
            raw, transport = (base64.b64decode(raw) if isinstance(raw, str) else raw), _BINARY
        digest.update(bytes([transport]) + struct.pack(">I", len(raw)) + raw)
    return digest.hexdigest()


def rendered(attributes: dict[str, dict]) -> dict[str, dict]:
    """Attributes as the JSON protocol answers them (Binary values in base64)."""
    return {name: ({"DataType": v["DataType"],
                    "BinaryValue": base64.b64encode(v["BinaryValue"]).decode("ascii")}
                   if "BinaryValue" in v else dict(v)) for name, v in attributes.items()}


def pick_attributes(attributes: dict[str, dict], names: Any) -> dict[str, dict]:
    """The attributes ReceiveMessage's MessageAttributeNames ask for ("All", ".*", names,
    and prefixes ending ".*")."""
    if names is None:
        return {}
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid("MessageAttributeNames must be a list of strings.")
    if "All" in names or ".*" in names:
        return dict(attributes)
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    return {k: v for k, v in attributes.items()
            if k in names or (prefixes and k.startswith(prefixes))}


# -- the envelope ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Envelope:
    """What an SQS message carries beyond its body, kept in the stored body."""

    body: str
    attributes: dict[str, dict] = field(default_factory=dict)
    trace: str | None = None
    group: str | None = None
    dedup: str | None = None
    sequence: str | None = None
    source: str | None = None      # the ARN of the queue that dead-lettered it
    sent_ms: int | None = None     # when first sent (kept across a dead-letter move)

    def needed(self) -> bool:
        """Whether storing this message needs the envelope (anything beside the body)."""
        return self != Envelope(self.body)

    def stored(self) -> Any:
        """The body to store: the bare body, or the map that keeps the rest."""
        if not self.needed():
            return self.body
        record: dict[str, Any] = {MARK: 1, "b": self.body}
        if self.attributes:
            record["a"] = self.attributes
        for key, value in (("t", self.trace), ("g", self.group), ("d", self.dedup),
                           ("s", self.sequence), ("src", self.source), ("at", self.sent_ms)):
            if value is not None:
                record[key] = value
        return record

    def moved(self, **changes: Any) -> "Envelope":
        return replace(self, **changes)


def opened(body: Any) -> Envelope:
    """The envelope of a received body (a bare body becomes one with nothing else)."""
    if isinstance(body, dict) and body.get(MARK) == 1 and isinstance(body.get("b"), str):
        return Envelope(body["b"], body.get("a") or {}, body.get("t"), body.get("g"),
                        body.get("d"), body.get("s"), body.get("src"), body.get("at"))
    return Envelope(body_text(body))


def check_system_names(names: Any) -> list[str]:
    """The system attribute names a ReceiveMessage asks for ("All" expands)."""
    return check_names(names, SYSTEM_ATTRIBUTES)


def system_attributes(message, envelope: Envelope, names: list[str],
                      sender: str) -> dict[str, str]:
    """The system attributes ``names`` of a received message (those it has). The first
    receive time is the one its shard stored with it (a received message has one)."""
    first_s = message.first_received_at_s or message.enqueued_at
    values = {"SentTimestamp": str(envelope.sent_ms or int(message.enqueued_at * 1000)),
              "ApproximateReceiveCount": str(message.dequeue_count),
              "ApproximateFirstReceiveTimestamp": str(int(first_s * 1000)),
              "SenderId": sender, "MessageGroupId": group_of(message, envelope),
              "MessageDeduplicationId": envelope.dedup, "SequenceNumber": envelope.sequence,
              "AWSTraceHeader": envelope.trace, "DeadLetterQueueSourceArn": envelope.source}
    return {name: values[name] for name in names if values.get(name) is not None}


def group_of(message, envelope: Envelope) -> str:
    """A received message's MessageGroupId: the one kept in its envelope, else its tenant
    (the ``default`` account sends as its group; another account's own name is kept so)."""
    return envelope.group or message.tenant


def key_in(ordered: bool, message, envelope: Envelope) -> str | None:
    """The fairness key a received message takes when sent on to a queue: its group on an
    ordered (FIFO) queue; on a standard one the group its envelope keeps, else (None) the
    runtime's key."""
    return group_of(message, envelope) if ordered else envelope.group
