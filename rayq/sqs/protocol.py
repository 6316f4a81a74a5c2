"""The SQS JSON protocol's envelope: which action a request asks for, with what."""

from __future__ import annotations

import json

from rayq.sqs.errors import SqsError

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
