"""Back-off: how long to wait before trying again, and when to stop trying.

One shape for every retry in rayq: a task whose handler raised waits
``first_s * 2 ** (attempt - 1)`` before its next delivery, capped at ``max_s``;
a call that meets a restarting actor is issued again on the same schedule until
``give_up_after_s`` has passed.
"""

from __future__ import annotations

from dataclasses import dataclass


def backoff_s(attempt: int, first_s: float, max_s: float) -> float:
    """The wait before try ``attempt + 1`` after ``attempt`` tries (1 = the first):
    doubling from ``first_s``, never over ``max_s``."""
    return min(first_s * 2 ** (max(attempt, 1) - 1), max_s)


@dataclass(frozen=True)
class RetrySchedule:
    """When to issue a failed call again: doubling waits from ``first_s`` up to
    ``max_s``, for at most ``give_up_after_s`` from the first try."""

    first_s: float = 0.05
    max_s: float = 1.0
    give_up_after_s: float = 60.0

    def wait_s(self, attempt: int) -> float:
        return backoff_s(attempt, self.first_s, self.max_s)

    def gives_up(self, started: float, now: float) -> bool:
        """True once ``give_up_after_s`` has passed since ``started`` (monotonic seconds)."""
        return now - started >= self.give_up_after_s
