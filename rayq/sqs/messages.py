"""Messages between SQS's shapes and rayq's: bodies, the ``type`` message attribute,
MD5 digests (SDKs check them), system attributes of received messages."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from typing import Any

from rayq.sqs.attributes import check_names
from rayq.sqs.errors import SqsError, invalid, too_long

TYPE_ATTRIBUTE = "type"
SYSTEM_ATTRIBUTES = ("SentTimestamp", "ApproximateReceiveCount", "SenderId", "MessageGroupId")
# Characters SQS accepts in a body: #x9 #xA #xD, #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF.
_BAD_CHARS = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_STRING, _BINARY = 1, 2


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def check_body(body: Any, max_bytes: int) -> str:
    """A SendMessage body. Raises MissingParameter, InvalidMessageContents, or
    InvalidParameterValue when it is too long."""
    if body is None or body == "":
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    if not isinstance(body, str):
        raise invalid("MessageBody must be a string.")
    if _BAD_CHARS.search(body):
        raise SqsError("InvalidMessageContents",
                       "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD "
                       "| #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")
    if len(body.encode("utf-8")) > max_bytes:
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


def message_type(attributes: Any) -> str:
    """The rayq type a message's attributes carry (``default`` without one). rayq keeps only
    the String attribute ``type``; any other attribute is refused, not dropped."""
    if attributes is None or attributes == {}:
        return "default"
    if not isinstance(attributes, dict):
        raise invalid("MessageAttributes must be a map.")
    for name in attributes:
        if name != TYPE_ATTRIBUTE:
            raise invalid(f"Message attribute {name!r} is not supported: rayq keeps only the "
                          f"String attribute {TYPE_ATTRIBUTE!r} (the message's rayq type).")
    value = attributes[TYPE_ATTRIBUTE]
    if not isinstance(value, dict) or value.get("DataType") != "String" \
            or not isinstance(value.get("StringValue"), str) or not value["StringValue"]:
        raise invalid(f"Message attribute {TYPE_ATTRIBUTE!r} must have DataType String and a "
                      "non-empty StringValue.")
    return value["StringValue"]


def type_attributes(type_: str) -> dict:
    return {TYPE_ATTRIBUTE: {"DataType": "String", "StringValue": type_}}


def attributes_md5(attributes: dict) -> str:
    """MD5OfMessageAttributes, computed as SQS does: per attribute in name order, each of
    name, data type and value prefixed by its 4-byte length, plus a transport-type byte."""
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        for part in (name.encode(), value["DataType"].encode()):
            digest.update(struct.pack(">I", len(part)) + part)
        if "StringValue" in value:
            raw, transport = value["StringValue"].encode(), _STRING
        else:
            raw, transport = base64.b64decode(value["BinaryValue"]), _BINARY
        digest.update(bytes([transport]) + struct.pack(">I", len(raw)) + raw)
    return digest.hexdigest()


def check_system_names(names: Any) -> list[str]:
    """The system attribute names a ReceiveMessage asks for ("All" expands)."""
    return check_names(names, SYSTEM_ATTRIBUTES)


def wants_type(names: Any) -> bool:
    """Whether ReceiveMessage's MessageAttributeNames ask for the ``type`` attribute."""
    if names is None:
        return False
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid("MessageAttributeNames must be a list of strings.")
    return any(n in ("All", ".*", TYPE_ATTRIBUTE) or
               (n.endswith(".*") and TYPE_ATTRIBUTE.startswith(n[:-2])) for n in names)


def system_attributes(message, names: list[str]) -> dict[str, str]:
    values = {"SentTimestamp": str(int(message.enqueued_at * 1000)),
              "ApproximateReceiveCount": str(message.dequeue_count),
              "SenderId": message.tenant, "MessageGroupId": message.tenant}
    return {name: values[name] for name in names}
