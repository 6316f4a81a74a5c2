"""Tasks by id: what a task is doing (``client.task``), and the ids tasks go by."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import Enum

from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import outcome_succeeded
from rayq.errors import InvalidMessage


class TaskState(str, Enum):
    """Where a task is: its ``TaskInfo.state`` (equal to its value as a string)."""

    QUEUED = "queued"        # waiting for a consumer (or a retry after a failed run)
    RUNNING = "running"      # a consumer holds it now
    SUCCEEDED = "succeeded"  # its handler returned a value
    FAILED = "failed"        # it ended without a value: its handler raised for the last
                             # time, or it expired or was deleted before it ran
    CANCELLED = "cancelled"  # withdrawn by client.cancel, before or while it ran


@dataclass(frozen=True)
class TaskInfo:
    """A task as ``client.task(task_id)`` shows it. Times are seconds since the epoch;
    ``started_at`` is its first delivery's (None: never started), ``ended_at`` None
    while it has not ended. ``attempts``: how many times it was delivered."""

    id: str
    type: str
    tenant: str
    state: TaskState
    attempts: int
    submitted_at: float
    started_at: float | None
    ended_at: float | None

    @property
    def done(self) -> bool:
        return self.state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


def task_state(ending: Ending | None, payload: bytes, running: bool) -> TaskState:
    """A task's state from its recorded ending (None: not ended), the outcome's payload
    and whether a consumer holds it now."""
    if ending is None:
        return TaskState.RUNNING if running else TaskState.QUEUED
    if ending is Ending.CANCELLED:
        return TaskState.CANCELLED
    if ending is Ending.RESULT and outcome_succeeded(payload):
        return TaskState.SUCCEEDED
    return TaskState.FAILED


MAX_TASK_ID = 256  # characters of a task id


def check_task_id(task_id: object) -> str:
    """A task id as given: a non-empty printable str of at most MAX_TASK_ID characters.
    Raises InvalidMessage."""
    if not isinstance(task_id, str) or not 1 <= len(task_id) <= MAX_TASK_ID \
            or not task_id.isprintable():
        raise InvalidMessage(f"a task id is a printable str of 1 to {MAX_TASK_ID} "
                             f"characters, not {task_id!r}")
    return task_id


def new_task_id() -> str:
    """A random task id (what a task goes by when its submitter chose none)."""
    return uuid.uuid4().hex


def checked_task_ids(task_ids: object, count: int) -> list[str]:
    """``count`` task ids as given, each checked (:func:`check_task_id`). Raises
    InvalidMessage."""
    if not isinstance(task_ids, (list, tuple)) or len(task_ids) != count:
        raise InvalidMessage(f"task_ids takes one id per call ({count})")
    return [check_task_id(task_id) for task_id in task_ids]
