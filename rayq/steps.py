"""Steps: an operation that needs several requests, written once, with no I/O.

A generator yields each :class:`Request` it needs; a driver answers it (or throws its
error in) and the generator's return is the result. A blocking driver
(:meth:`rayq.transport.Transport.run`) and an awaiting one
(:meth:`rayq.transport.Transport.run_async`) run the same steps, so a client thread and an
event loop (the SQS endpoint's) share one piece of code per operation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from rayq.core.auth.operations import Operation
from rayq.core.kit.retry import RetrySchedule


@dataclass(frozen=True)
class Request:
    """One signed request a sequence of steps (:meth:`Transport.run`) asks to be made:
    ``operation`` on ``handle`` with these arguments (``queue=`` among ``kwargs``),
    issued again while its actor restarts for as long as ``schedule`` says (None: the
    driver's own)."""

    operation: Operation
    handle: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    schedule: RetrySchedule | None = None


Steps = Generator[Request, Any, Any]


def advance(steps: Steps, answer: Any, error: Exception | None) -> tuple[bool, Any]:
    """Hand ``steps`` the last request's answer (or throw in its error): (False, the next
    Request) or (True, the steps' result)."""
    try:
        return False, steps.throw(error) if error is not None else steps.send(answer)
    except StopIteration as finished:
        return True, finished.value


def drive(steps: Steps, make: Callable[[Request], Any]) -> Any:
    """The result of ``steps``, each Request answered by ``make(request)`` (its error, if
    it raises one, thrown into the steps, which may go on)."""
    done, value = advance(steps, None, None)
    while not done:
        answer, error = None, None
        try:
            answer = make(value)
        except Exception as err:
            error = err
        done, value = advance(steps, answer, error)
    return value


async def drive_async(steps: Steps, make: Callable[[Request], Awaitable[Any]]) -> Any:
    """:func:`drive` with each Request awaited."""
    done, value = advance(steps, None, None)
    while not done:
        answer, error = None, None
        try:
            answer = await make(value)
        except Exception as err:
            error = err
        done, value = advance(steps, answer, error)
    return value

