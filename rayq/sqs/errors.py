"""SQS's error shapes, and how rayq's errors map onto them.

An error goes back as JSON ``{"__type": "com.amazonaws.sqs#<Code>", "message": ...}``
with an ``x-amzn-query-error: <legacy code>;Sender`` header, as SQS sends it:
boto3 picks the exception class (``client.exceptions.QueueDoesNotExist``) from
``__type`` and shows the legacy code as ``Error.Code``.
"""

from __future__ import annotations

from rayq.core.auth.accounts import SignatureMismatch
from rayq.errors import Throttled
from rayq.errors import (AuthError, InvalidMessage, MessageTooLarge, Overloaded, QueueDisabled,
                         QueueNotFound, QuotaExceeded, RayqError, ReceiptInvalid, RuntimeFailure,
                         UsageError)

# Codes whose legacy (Query protocol) name differs from the JSON shape name.
_LEGACY = {
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "QueueNameExists": "QueueAlreadyExists",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
    "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
    "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
    "PurgeQueueInProgress": "AWS.SimpleQueueService.PurgeQueueInProgress",
    "QueueDeletedRecently": "AWS.SimpleQueueService.QueueDeletedRecently",
}


class SqsError(Exception):
    """Raised when a request gets one of SQS's errors; ``status`` is the HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400, sender: bool = True):
        super().__init__(message)
        self.code, self.message, self.status, self.sender = code, message, status, sender

    def body(self) -> dict:
        return {"__type": f"com.amazonaws.sqs#{self.code}", "message": self.message}

    def query_error(self) -> str:
        """The ``x-amzn-query-error`` header value."""
        return f"{_LEGACY.get(self.code, self.code)};{'Sender' if self.sender else 'Receiver'}"


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def missing(name: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {name}.")


def no_queue() -> SqsError:
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


def out_of_range(name: str, value: object, reason: str) -> SqsError:
    """A parameter outside its range, worded as SQS words it."""
    return invalid(f"Value {value!s:.80} for parameter {name} is invalid. Reason: {reason}")


def int_param(params: dict, name: str, low: int, high: int,
              default: int | None = None) -> int | None:
    """A request's integer parameter ``name``, from ``low`` to ``high``; ``default`` when
    it is absent. Raises InvalidParameterValue otherwise."""
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise out_of_range(name, value, f"Must be between {low} and {high}, if provided.")
    return value


def too_long(max_bytes: int) -> SqsError:
    return invalid(f"One or more parameters are invalid. Reason: Message must be shorter than "
                   f"{max_bytes} bytes.")


def bad_handle(handle: object) -> SqsError:
    return SqsError("ReceiptHandleIsInvalid",
                    f'The input receipt handle "{handle!s:.200}" is not a valid receipt handle.')


def from_rayq(err: RayqError) -> SqsError:
    """The SQS error a rayq error stands for. The message says what rayq said."""
    text = str(err)
    if isinstance(err, QueueNotFound):
        return no_queue()
    if isinstance(err, ReceiptInvalid):
        return SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
    if isinstance(err, MessageTooLarge):
        return invalid(f"One or more parameters are invalid. Reason: {text}")
    if isinstance(err, SignatureMismatch):  # a key rotated out since the endpoint's copy
        return SqsError("InvalidClientTokenId",
                        "The security token included in the request is invalid.", status=403)
    if isinstance(err, Throttled):  # SQS's throttling code: SDKs retry it with back-off
        return SqsError("RequestThrottled", text, status=400)
    if isinstance(err, QuotaExceeded):  # SQS's code for an action past a limit
        return SqsError("OverLimit", text, status=403)
    if isinstance(err, AuthError):
        return SqsError("AccessDenied", f"Access to the resource is denied: {text}", status=403)
    if isinstance(err, (InvalidMessage, UsageError)):
        return invalid(text)
    if isinstance(err, (Overloaded, QueueDisabled)):  # not now: SDKs retry a 503
        return SqsError("ServiceUnavailable", text, status=503, sender=False)
    if isinstance(err, RuntimeFailure):
        return SqsError("InternalFailure", text, status=500, sender=False)
    return SqsError("InternalFailure", text, status=500, sender=False)
