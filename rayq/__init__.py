"""rayq: a durable, multi-tenant message queue and fair scheduling runtime on Ray.

    client = rayq.start()                 # embedded: local Ray, data in ./.rayq-data

    @rayq.task(type="report")
    def build_report(org_id): ...
    ray.get(client.submit(build_report, 42, tenant="acme"))

    q = client.create_queue("jobs")
    q.send({"report": 42}, tenant="acme", type="report")
    for m in q.receive(max_messages=10, wait_s=5):
        ...
        q.delete(m.receipt)
"""

from __future__ import annotations

import importlib

from rayq.config import (Config, ConsumerConfig, FairnessConfig, FloodConfig, ScalingConfig,
                         StoreConfig)
from rayq.core.codec.model import Outgoing, Received
from rayq.core.fairness.policy import FairnessReport
from rayq.core.flood.detection import Flooder
from rayq.core.fairness.rules import SuspensionRule
from rayq.core.codec.task_ids import TaskInfo, TaskState
from rayq.core.control.schedules import Schedule
from rayq.tasks import TaskContext, TaskFunction, current_task, task
from rayq.errors import (AuthError, ConfigError, DataDirExposed, InvalidMessage, KeyExposed,
                         MessageTooLarge, NoEvents, NotEnoughReplicas, OutcomeLost, Overloaded,
                         QueueDisabled, QueueExists, QueueNotFound, QuotaExceeded, RayqError,
                         ReceiptInvalid, ReplicaBehind, ResultTimeout, RuntimeFailure, StaleEpoch,
                         StoreBug, StoreError, TaskCancelled, TaskError, TaskNotFound, TaskTimedOut,
                         UnknownLayout, UsageError)
from rayq.errors import Throttled

# Names that need Ray live in modules loaded on first use, so that importing
# rayq.core (or rayq.config, rayq.errors) never loads Ray or the actors.
_LAZY = {"start": "rayq.runtime.session", "connect": "rayq.runtime.session", "shutdown": "rayq.runtime.session",
         "Client": "rayq.client", "Queue": "rayq.queue", "QueueStats": "rayq.queue",
         "QueueMetadata": "rayq.queue", "KeyStats": "rayq.queue", "Report": "rayq.analytics.report",
         "serve_sqs": "rayq.runtime.serving"}

__all__ = [
    "start", "connect", "shutdown", "serve_sqs", "Client", "Queue", "QueueStats", "QueueMetadata",
    "KeyStats", "Report",
    "Config", "ConsumerConfig", "FairnessConfig", "FloodConfig", "ScalingConfig", "StoreConfig",
    "Outgoing", "Received", "task", "TaskFunction", "TaskInfo", "TaskState", "FairnessReport",
    "SuspensionRule",
    "Flooder",
    "AuthError", "ConfigError", "DataDirExposed", "InvalidMessage", "KeyExposed", "MessageTooLarge",
    "NoEvents", "Overloaded",
    "QueueDisabled", "QueueExists", "QueueNotFound", "QuotaExceeded", "RayqError", "ReceiptInvalid",
    "RuntimeFailure", "StoreBug", "StoreError", "TaskError", "TaskNotFound", "OutcomeLost",
    "ResultTimeout", "UnknownLayout", "UsageError",
    "StaleEpoch", "ReplicaBehind", "NotEnoughReplicas",
    "TaskCancelled", "TaskTimedOut", "TaskContext", "current_task", "Schedule",
    "Throttled",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'rayq' has no attribute {name!r}")

