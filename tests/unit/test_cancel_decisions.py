"""How a stopped handler's delivery ends, the time limit of one call, and the errors a
stopped task's ref raises: tables of cases, no Ray."""

import pytest

import rayq
from rayq.config import ConsumerConfig
from rayq.core.codec.tasks import (TaskSpec, decode_call_options, decode_outcome, encode_call,
                                   encode_error, task_time_limit_s)
from rayq.core.consumers.decisions import (Cancelled, DeadLetter, Retry, Stop, call_limit_s,
                                           forced_after_s, stop_error, stopped_end,
                                           stuck_after_s)
from rayq.core.codec.model import Ending
from rayq.core.codec.tasks import Outcome
from rayq.core.storage import writes
from rayq.core.storage.waiters import outcome_value
from rayq.errors import InvalidMessage, TaskCancelled, TaskError, TaskTimedOut

CONFIG = ConsumerConfig()


def spec(**kw):
    return TaskSpec("report", "tasks", **kw)


def test_a_cancelled_call_ends_cancelled_whatever_its_tries_or_rule():
    for attempt in (1, 5):
        end = stopped_end(Stop.CANCELLED, attempt, spec(retry_on=(ValueError,)), 5, CONFIG)
        assert isinstance(end, Cancelled) and end.outcome is Outcome.CANCELLED
        assert isinstance(end.write("r", b"x", 9), writes.Finish)  # never dead-lettered
        assert end.outcome_if_lost is Outcome.CANCELLED


@pytest.mark.parametrize("kw, attempt, expected", [
    ({}, 1, Retry),                                       # retried like any failure
    ({}, 5, DeadLetter),                                  # the last try
    ({"no_retry_on": (TaskTimedOut,)}, 1, DeadLetter),    # its type does not retry it
    ({"retry_on": (OSError,)}, 1, DeadLetter),            # not among what it retries
    ({"retry_on": (TaskError,)}, 1, Retry),               # a base class counts
    ({"retry_on": (TaskTimedOut,)}, 1, Retry),
])
def test_a_timed_out_call_follows_its_types_retry_rule(kw, attempt, expected):
    end = stopped_end(Stop.TIMED_OUT, attempt, spec(time_limit_s=2, **kw), 5, CONFIG)
    assert isinstance(end, expected)


@pytest.mark.parametrize("type_limit, asked, expected", [
    (None, None, None), (10, None, 10), (None, 3, 3), (10, 3, 3), (10, 30, 10),
    (10, "x", 10), (10, -1, 10),  # a body's option that is no limit leaves the type's
])
def test_a_calls_limit_is_its_types_lowered_by_its_submit(type_limit, asked, expected):
    options = {} if asked is None else {"time_limit_s": asked}
    assert call_limit_s(spec(time_limit_s=type_limit), options) == expected


def test_submit_may_only_lower_its_types_limit():
    assert task_time_limit_s(spec(time_limit_s=10), 2) == 2
    assert task_time_limit_s(spec(), 2) == 2
    assert task_time_limit_s(spec(time_limit_s=10), None) == 10
    for bad in (11, 0, -1, True, "2"):
        with pytest.raises(InvalidMessage):
            task_time_limit_s(spec(time_limit_s=10), bad)


@pytest.mark.parametrize("kw", [{"time_limit_s": 0}, {"time_limit_s": "1"},
                                {"cancel_grace_s": -1}, {"cancel_grace_s": None},
                                {"time_limit_s": 10**9}])
def test_a_bad_limit_or_grace_is_refused(kw):
    with pytest.raises(InvalidMessage):
        spec(**kw)


def test_the_decorator_keeps_the_limit_and_grace():
    @rayq.task(time_limit_s=5, cancel_grace_s=0.5)
    def f():
        pass
    assert (f.spec.time_limit_s, f.spec.cancel_grace_s) == (5, 0.5)
    assert rayq.task(lambda: None).spec.cancel_grace_s == 10


def test_a_cancelled_handler_has_its_grace_a_timed_out_one_none():
    assert forced_after_s(Stop.CANCELLED, 3) == 3
    assert forced_after_s(Stop.TIMED_OUT, 3) == 0
    assert stuck_after_s(0) == 1.0 and stuck_after_s(5) == 5


def test_a_calls_options_travel_in_its_body_and_old_bodies_still_read():
    body = encode_call("report", (1,), {"a": 2}, 1 << 20, "t1", 2.5)
    assert decode_call_options(body) == ([1], {"a": 2}, {"id": "t1", "time_limit_s": 2.5})
    plain = encode_call("report", (1,), {}, 1 << 20)
    assert decode_call_options(plain) == ([1], {}, {})


def test_stopped_tasks_raise_their_own_task_errors():
    with pytest.raises(TaskCancelled) as cancelled:
        outcome_value(Ending.CANCELLED, b"")
    assert cancelled.value.error_type == "TaskCancelled"
    with pytest.raises(TaskTimedOut) as timed_out:
        decode_outcome(encode_error("TaskTimedOut", "late"))
    assert isinstance(timed_out.value, TaskError) and timed_out.value.error_message == "late"
    assert isinstance(stop_error(Stop.TIMED_OUT, 2), TaskTimedOut)
    assert "2 s" in str(stop_error(Stop.TIMED_OUT, 2))


def test_current_task_outside_a_handler_is_a_usage_error():
    with pytest.raises(rayq.UsageError):
        rayq.current_task()
