"""rayq: a durable, multi-tenant message queue and fair scheduling runtime on Ray."""

from rayq.config import (Config, ConsumerConfig, FairnessConfig, FloodConfig, StoreConfig)
from rayq.core.model import Outgoing, Received
from rayq.errors import (AuthError, InvalidMessage, MessageTooLarge, Overloaded, QueueDisabled,
                         QueueExists, QueueNotFound, RayqError, ReceiptInvalid, RuntimeFailure,
                         StoreError, TaskError, UsageError)

__all__ = [
    "Config", "ConsumerConfig", "FairnessConfig", "FloodConfig", "StoreConfig",
    "Outgoing", "Received",
    "AuthError", "InvalidMessage", "MessageTooLarge", "Overloaded", "QueueDisabled",
    "QueueExists", "QueueNotFound", "RayqError", "ReceiptInvalid", "RuntimeFailure",
    "StoreError", "TaskError", "UsageError",
]
