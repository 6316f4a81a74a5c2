"""Task codecs, the task registry, tallies and the @task decorator (no Ray)."""

import pytest

from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.tasks import (Outcome, Tally, TaskFunction, TaskRegistry, TaskSpec, UsageReport,
                             decode_call, decode_outcome, encode_call, encode_error,
                             encode_result, percentile, task)
from rayq.errors import InvalidMessage, MessageTooLarge, TaskError


def test_a_call_round_trips_its_arguments():
    body = encode_call("t", (1, "a", b"b", [None]), {"k": {"x": 1.5}}, 1 << 20)
    assert decode_call(body) == ([1, "a", b"b", [None]], {"k": {"x": 1.5}})


@pytest.mark.parametrize("args, kwargs", [((object(),), {}), ((), {"k": {1, 2}}), ((), {1: "x"})])
def test_arguments_that_are_not_msgpack_values_are_refused_with_a_clear_error(args, kwargs):
    with pytest.raises(InvalidMessage, match="msgpack|str"):
        encode_call("t", args, kwargs, 1 << 20)


def test_a_call_over_the_size_limit_is_too_large():
    with pytest.raises(MessageTooLarge):
        encode_call("t", (b"x" * 2000,), {}, 1000)


@pytest.mark.parametrize("body", [b"\x01plain str", b"\x02\x91\x01", b"\x09"])
def test_a_body_that_is_not_a_call_is_refused(body):
    with pytest.raises(InvalidMessage):
        decode_call(body)


def test_outcomes_give_back_the_value_or_raise_the_handlers_error():
    assert decode_outcome(encode_result({"ok": [1]}, "t")) == {"ok": [1]}
    with pytest.raises(TaskError) as err:
        decode_outcome(encode_error("KeyError", "'x'"))
    assert (err.value.error_type, err.value.error_message) == ("KeyError", "'x'")
    with pytest.raises(InvalidMessage, match="not msgpack-able"):
        encode_result(object(), "t")


def test_the_registry_keeps_handlers_across_reopening(tmp_path):
    kv = LmdbKV(tmp_path / "m")
    registry = TaskRegistry(kv)
    v0 = registry.version
    v1 = registry.register(TaskSpec("report", "tasks", concurrency=2), b"pickled")
    assert v1 != v0 and registry.register(TaskSpec("report", "tasks", concurrency=2), b"pickled") == v1
    kv.close()
    again = TaskRegistry(LmdbKV(tmp_path / "m"))
    assert again.all() == {"report": (TaskSpec("report", "tasks", concurrency=2), b"pickled")}
    assert again.queues() == ["tasks"]
    with pytest.raises(InvalidMessage):
        again.register(TaskSpec("x", "tasks"), b"")


@pytest.mark.parametrize("fields", [dict(type=""), dict(queue=3), dict(concurrency=0),
                                    dict(max_receives=0)])
def test_bad_task_specs_are_refused(fields):
    with pytest.raises(InvalidMessage):
        TaskSpec(**{"type": "t", "queue": "tasks", **fields})


def test_the_decorator_keeps_the_function_callable_and_names_its_type():
    @task
    def plain(x):
        return x + 1

    @task(type="report", concurrency=3)
    def build(x):
        return x

    assert isinstance(plain, TaskFunction) and plain(1) == 2
    assert plain.spec == TaskSpec("plain", "tasks")
    assert build.spec == TaskSpec("report", "tasks", concurrency=3)
    with pytest.raises(InvalidMessage):
        task(type="x")(42)


def _report(tenant, outcome, wait_s, usage_s=1.0):
    return UsageReport(tenant, tenant, "t", usage_s, outcome, wait_s, 0.0)


def test_tallies_count_outcomes_and_wait_percentiles():
    tally = Tally()
    for i in range(1, 101):
        tally.add(_report("acme", Outcome.SUCCEEDED, float(i)))
    tally.add(_report("acme", Outcome.DEFERRED, 999.0, usage_s=0.0))
    tally.add(_report("beta", Outcome.DEAD, 1.0))
    [acme, beta] = tally.rows()
    assert (acme.succeeded, acme.deferred, acme.usage_s) == (100, 1, 100.0)
    assert (acme.wait_p50_s, acme.wait_p99_s) == (50.0, 99.0)  # deferrals are not waits
    assert (beta.tenant, beta.dead) == ("beta", 1)
    [by_type] = tally.rows(by="type")
    assert (by_type.tenant, by_type.type, by_type.succeeded, by_type.dead) == ("*", "t", 100, 1)
    assert by_type.wait_p50_s == 50.0


@pytest.mark.parametrize("values, q, expected", [([], 50, 0.0), ([3.0], 99, 3.0),
                                                 ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
                                                 ([1.0, 2.0, 3.0, 4.0], 100, 4.0)])
def test_percentile_is_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected
