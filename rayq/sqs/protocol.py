"""The SQS protocols' envelopes: which action a request asks for, with what, and how
its answer is written.

The JSON protocol (what current SDKs send): a POST with ``X-Amz-Target:
AmazonSQS.<Action>`` and a JSON body, answered in JSON. The Query protocol (older
SDKs): form-encoded parameters (``Action=SendMessage&QueueUrl=...&
MessageAttribute.1.Name=...``), answered in XML. :func:`decode_query` turns a Query
request's parameters into those the JSON protocol would carry, so
:class:`~rayq.sqs.api.SqsApi` serves both; :func:`encode_query` writes an action's
JSON-shaped result as SQS's XML answer, :func:`query_error` an error. Both the Query
names of SQS's API reference (``Attribute.1.Name``, ``AttributeName.1``,
``SendMessageBatchRequestEntry.1.Id``) and the ones botocore's Query serializer writes
from the JSON names (``Attributes.1.key``) are read.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from rayq.sqs.errors import SqsError
from rayq.sqs.sigv4 import PRESIGN_PARAMS

JSON_TYPE = "application/x-amz-json-1.0"



def decode_request(method: str, target: str, body: bytes) -> tuple[str, dict]:
    """(action, parameters) of a request: a POST whose ``X-Amz-Target`` header is
    ``AmazonSQS.<Action>`` and whose body is a JSON object (or empty). Raises
    SqsError (InvalidAction, SerializationException) otherwise."""
    service, _, action = target.partition(".")
    if method != "POST" or service != "AmazonSQS" or not action:
        raise SqsError("InvalidAction", "The endpoint speaks SQS's JSON protocol: POST with an "
                       "X-Amz-Target: AmazonSQS.<Action> header.")
    try:
        params = json.loads(body) if body else {}
    except (ValueError, RecursionError):  # nested past the parser's depth: the sender's fault
        raise SqsError("SerializationException", "The request body is not valid JSON.") from None
    return action, params


# -- the Query protocol ----------------------------------------------------------------
NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
FORM_TYPE = "application/x-www-form-urlencoded"
XML_TYPE = "text/xml"
# Query name -> JSON name of lists of strings.
_LISTS = {"AttributeName": "AttributeNames", "MessageAttributeName": "MessageAttributeNames",
          "MessageSystemAttributeName": "MessageSystemAttributeNames", "TagKey": "TagKeys",
          "AWSAccountId": "AWSAccountIds", "ActionName": "Actions"}
# Query name -> JSON name of maps written as N.Name/N.Value (or N.Key/N.Value).
_MAPS = {"Attribute": "Attributes", "MessageAttribute": "MessageAttributes",
         "MessageSystemAttribute": "MessageSystemAttributes", "Tag": "Tags"}
_ENTRIES = ("SendMessageBatchRequestEntry", "DeleteMessageBatchRequestEntry",
            "ChangeMessageVisibilityBatchRequestEntry")
_INTEGERS = ("DelaySeconds", "MaxNumberOfMessages", "VisibilityTimeout", "WaitTimeSeconds",
             "MaxResults", "MaxNumberOfMessagesPerSecond")


def is_query(content_type: str, query_string: str, target: str) -> bool:
    """Whether a request speaks the Query protocol (no JSON target; a form or ``Action=``)."""
    return not target and (content_type.startswith(FORM_TYPE) or "Action=" in query_string)


def decode_query(body: bytes, query_string: str, path: str, host: str) -> tuple[str, dict]:
    """(action, JSON-shaped parameters) of a Query request. A request to a queue's URL
    without a QueueUrl parameter names that queue. Raises SqsError."""
    try:
        pairs = parse_qsl(query_string, keep_blank_values=True) + parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise SqsError("MalformedQueryString", "The request is not a valid Query.") from None
    flat = dict(pairs)
    action = flat.pop("Action", "")
    flat.pop("Version", None)
    if "X-Amz-Signature" in flat:  # presigned: the signature's parameters are no action's
        for name in PRESIGN_PARAMS:
            flat.pop(name, None)
    if not action:
        raise SqsError("MissingAction", "The request must contain the parameter Action.")
    params = _convert(_tree(flat), action)
    if "QueueUrl" not in params and path.strip("/").count("/") == 1:
        params["QueueUrl"] = f"http://{host}/{path.strip('/')}"
    return action, params


def _tree(flat: dict[str, str]) -> dict:
    """``{"A.1.B": v}`` as ``{"A": {"1": {"B": v}}}``."""
    root: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split(".")
        node = root
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SqsError("MalformedQueryString", f"Parameter {name} is malformed.")
            node = child
        node[leaf] = value
    return root


def _ordered(node: Any) -> list:
    if not isinstance(node, dict):
        raise SqsError("MalformedQueryString", "A list parameter needs .N members.")
    try:
        return [node[k] for k in sorted(node, key=int)]
    except ValueError:
        raise SqsError("MalformedQueryString", "List members are numbered .1, .2, ...") from None


def _convert(tree: dict, action: str) -> dict:
    out: dict[str, Any] = {}
    for name, node in tree.items():
        if name in _LISTS:
            out[_LISTS[name]] = _ordered(node)
        elif name in _MAPS:
            json_name = "tags" if (name == "Tag" and action == "CreateQueue") else _MAPS[name]
            out[json_name] = _map(node)
        elif name in _ENTRIES or name == "Entries":
            out["Entries"] = [_convert(e, action) for e in _ordered(node)]
        elif isinstance(node, dict) and all(k.isdigit() for k in node):  # botocore's form
            items = _ordered(node)
            looks_like_map = items and isinstance(items[0], dict) and \
                ("key" in items[0] or "Name" in items[0])
            out[name] = _map(node) if looks_like_map else items
        elif name in _INTEGERS and isinstance(node, str):
            out[name] = _integer(node)
        else:
            out[name] = node
    return out


def _map(node: Any) -> dict:
    out = {}
    for item in _ordered(node):
        key = item.get("Name", item.get("Key", item.get("key"))) if isinstance(item, dict) else None
        if not isinstance(key, str):
            raise SqsError("MalformedQueryString", "A map member needs a Name and a Value.")
        out[key] = item.get("Value", item.get("value"))
    return out


def _integer(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text  # the action refuses it with SQS's own wording


# -- answers ------------------------------------------------------------------------------
_ENTRY_OF = {"SendMessageBatch": "SendMessageBatchResultEntry",
             "DeleteMessageBatch": "DeleteMessageBatchResultEntry",
             "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchResultEntry"}


def encode_query(action: str, result: dict, request_id: str) -> bytes:
    """An action's result as SQS's Query (XML) answer."""
    inner = "".join(_member(action, name, value) for name, value in result.items())
    return (f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}"><{action}Result>'
            f"{inner}</{action}Result><ResponseMetadata><RequestId>{request_id}</RequestId>"
            f"</ResponseMetadata></{action}Response>").encode()


def _member(action: str, name: str, value: Any) -> str:
    if name in ("QueueUrls", "queueUrls"):
        return "".join(_text("QueueUrl", url) for url in value)
    if name == "Attributes":
        return _pairs("Attribute", "Name", value)
    if name == "Tags":
        return _pairs("Tag", "Key", value)
    if name == "Messages":
        return "".join(f"<Message>{_message(m)}</Message>" for m in value)
    if name == "Successful":
        return "".join(_element(_ENTRY_OF[action], e) for e in value)
    if name == "Failed":
        return "".join(_element("BatchResultErrorEntry", e) for e in value)
    if name == "Results":
        return "".join(_element("Result", e) for e in value)
    return _text(name, value)


def _message(m: dict) -> str:
    out = []
    for name, value in m.items():
        if name == "Attributes":
            out.append(_pairs("Attribute", "Name", value))
        elif name == "MessageAttributes":
            out.append("".join(
                f"<MessageAttribute><Name>{escape(k)}</Name>{_element('Value', v)}"
                f"</MessageAttribute>" for k, v in value.items()))
        else:
            out.append(_text(name, value))
    return "".join(out)


def _pairs(tag: str, key_tag: str, values: dict) -> str:
    return "".join(f"<{tag}><{key_tag}>{escape(k)}</{key_tag}><Value>{escape(str(v))}</Value>"
                   f"</{tag}>" for k, v in values.items())


def _element(tag: str, fields: dict) -> str:
    return f"<{tag}>" + "".join(_text(k, v) for k, v in fields.items()) + f"</{tag}>"


def _text(tag: str, value: Any) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"<{tag}>{escape(str(value))}</{tag}>"


def query_error(err: SqsError, request_id: str) -> bytes:
    """An error as SQS's Query answer names it (the legacy code)."""
    code = err.query_error().split(";")[0]
    kind = "Sender" if err.sender else "Receiver"
    return (f'<?xml version="1.0"?><ErrorResponse xmlns="{NAMESPACE}"><Error><Type>{kind}</Type>'
            f"<Code>{escape(code)}</Code><Message>{escape(err.message)}</Message><Detail/>"
            f"</Error><RequestId>{request_id}</RequestId></ErrorResponse>").encode()
