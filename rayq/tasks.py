"""``@rayq.task``: a function registered as a job type, which ``client.submit`` runs on
the runtime's consumers."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from rayq.core.codec.tasks import TaskSpec
from rayq.errors import InvalidMessage, UsageError


class TaskFunction:
    """A function registered as a job type by :func:`task`. Calling it runs it here;
    ``client.submit(fn, ...)`` runs it on the runtime's consumers."""

    def __init__(self, fn, spec: TaskSpec):
        if not callable(fn):
            raise InvalidMessage(f"@rayq.task decorates a function, not {fn!r}")
        self.fn, self.spec = fn, spec
        self.__name__ = getattr(fn, "__name__", spec.type)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<rayq task {self.spec.type!r} on queue {self.spec.queue!r}>"


def task(fn=None, *, type: str | None = None, queue: str = "tasks",
         concurrency: int | None = None, max_receives: int = 5,
         num_cpus: float | None = None, num_gpus: float | None = None,
         memory: int | None = None, resources: dict[str, float] | None = None,
         runtime_env: dict[str, Any] | None = None,
         retry_on: tuple[type[BaseException], ...] | None = None,
         no_retry_on: tuple[type[BaseException], ...] = (),
         backoff_s: float | None = None, max_backoff_s: float | None = None,
         jitter: bool = True, time_limit_s: float | None = None, cancel_grace_s: float = 10):
    """Register a function as a job type: ``@rayq.task(type="report")``.

    ``type`` defaults to the function's name; ``queue`` is the queue that
    carries it (created on first use with this ``max_receives``);
    ``concurrency`` caps how many run at once cluster-wide; a task that fails
    ``max_receives`` times (or the queue's limit, if lower) ends in ``<queue>-dlq``.

    With none of ``num_cpus``, ``num_gpus``, ``memory`` (bytes), ``resources`` (custom
    resource name -> amount) and ``runtime_env`` set, handlers run on the consumers'
    threads and must be importable where consumers run (or defined in ``__main__``).
    With any of them set, each call runs as a Ray task with these options, on a node
    that has the resources, in that runtime environment (``num_cpus`` defaults to 1,
    Ray's default for a task): see docs/ray-jobs.md, "Where handlers run".

    A call that raised is retried (up to ``max_receives`` deliveries) unless its
    exception is an instance of one of ``no_retry_on``, or ``retry_on`` is given and it
    is an instance of none: then it fails at once, its error kept and the message
    dead-lettered. Retries wait ``backoff_s`` doubling with each try up to
    ``max_backoff_s`` (the consumers' ``retry_backoff_s`` and ``max_backoff_s`` when
    None); with ``jitter`` each wait is drawn between half of it and all of it.

    ``time_limit_s`` (None: none; ``submit`` may lower it per call) stops a call that
    runs longer: it fails with TaskTimedOut, retried under the same rule. A handler told
    to stop (cancelled, or past its limit) that has not returned ``cancel_grace_s``
    later is stopped by force (docs/tasks.md, "Cancel and time limits").
    Raises InvalidMessage for a bad value.
    """
    def wrap(f):
        return TaskFunction(f, TaskSpec(type or getattr(f, "__name__", ""), queue,
                                        concurrency, max_receives, num_cpus, num_gpus,
                                        memory, resources, runtime_env, retry_on,
                                        no_retry_on, backoff_s, max_backoff_s, jitter,
                                        time_limit_s, cancel_grace_s))
    return wrap(fn) if fn is not None else wrap


# -- the task a handler runs for ---------------------------------------------------------
@dataclass
class TaskContext:
    """What ``rayq.current_task()`` shows a running handler: the task's ``id`` (as
    ``client.task_id`` tells it), ``type``, ``tenant`` and ``attempt`` (its delivery, 1 = the first), and
    ``cancelled``, which turns True when the task was cancelled or ran past its time limit:
    a handler that checks it can return early, before it is stopped by force."""

    id: str
    type: str
    tenant: str
    attempt: int
    cancelled: bool = False


_CURRENT: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("rayq_current_task")


def current_task() -> TaskContext:
    """The task the calling handler runs for (on a consumer's thread or event loop).
    Raises UsageError outside a handler, and inside a handler that runs as a Ray task
    (that one is told by Ray's own cancellation: KeyboardInterrupt)."""
    found = _CURRENT.get(None)
    if found is None:
        raise UsageError("rayq.current_task() is called outside a task handler")
    return found


def running_as(context: TaskContext) -> contextvars.Token:
    """Make ``context`` the current task of this thread or coroutine (the consumer's)."""
    return _CURRENT.set(context)


def done_running(token: contextvars.Token) -> None:
    """Undo :func:`running_as` (a consumer thread goes on to other tasks)."""
    _CURRENT.reset(token)
