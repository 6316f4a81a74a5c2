"""Task codecs, the task registry, tallies and the @task decorator (no Ray)."""

import pytest

from rayq.core.codec.model import pack
from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.tasks import (Outcome, TaskSpec, UsageReport, decode_call, decode_outcome,
                                   encode_call, encode_error, encode_result)
from rayq.core.control.registry import TaskRegistry
from rayq.core.fairness.tallies import Tally, percentile
from rayq.tasks import TaskFunction, task
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
                                    dict(max_receives=0), dict(retry_on=(42,)),
                                    dict(no_retry_on=(int,)), dict(no_retry_on=("",)),
                                    dict(retry_on={"x": 1}), dict(backoff_s=-1),
                                    dict(max_backoff_s=True), dict(backoff_s=1e9),
                                    dict(jitter="yes")])
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


RAY_OPTIONS = dict(num_cpus=0.5, num_gpus=1, memory=1 << 30, resources={"special": 1},
                   runtime_env={"env_vars": {"A": "b"}, "pip": ("requests",),
                                "working_dir": "/srv/job"})


def test_the_ray_options_of_a_spec_round_trip_through_the_registry(tmp_path):
    kv = LmdbKV(tmp_path / "m")
    spec = TaskSpec("gpu", "tasks", **RAY_OPTIONS)
    assert spec.runtime_env["pip"] == ["requests"]  # kept as msgpack gives it back
    version = TaskRegistry(kv).register(spec, b"pickled")
    kv.close()
    again = TaskRegistry(LmdbKV(tmp_path / "m"))
    assert again.all() == {"gpu": (spec, b"pickled")}
    assert again.register(spec, b"pickled") == again.version != version
    assert hash(spec) == hash(TaskSpec("gpu", "tasks", **RAY_OPTIONS))


def test_a_retry_rule_names_its_exception_classes_and_round_trips_through_the_registry(
        tmp_path):
    @task(retry_on=(OSError, "mylib.Flaky"), no_retry_on=ValueError, backoff_s=0.5,
          max_backoff_s=10, jitter=False)
    def fetch(url):
        return url

    spec = fetch.spec
    assert spec.retry_on == ("builtins.OSError", "mylib.Flaky")
    assert spec.no_retry_on == ("builtins.ValueError",)
    kv = LmdbKV(tmp_path / "m")
    TaskRegistry(kv).register(spec, b"pickled")
    kv.close()
    again = TaskRegistry(LmdbKV(tmp_path / "m"))
    assert again.get("fetch") == spec  # msgpack's lists become tuples again


def test_a_stored_spec_from_before_the_ray_options_still_loads(tmp_path):
    kv = LmdbKV(tmp_path / "m")
    old = pack({"spec": {"type": "report", "queue": "tasks", "concurrency": None,
                         "max_receives": 5}, "handler": b"pickled"})
    kv.transact(lambda txn: txn.put("meta", b"task:report", old))
    loaded, _ = TaskRegistry(kv).all()["report"]
    assert loaded == TaskSpec("report", "tasks")
    assert (loaded.num_cpus, loaded.resources, loaded.runtime_env) == (None, None, None)


@pytest.mark.parametrize("fields, error", [
    (dict(num_cpus=-1), "num_cpus must be a number >= 0"),
    (dict(num_cpus="2"), "num_cpus must be a number"),
    (dict(num_gpus=True), "num_gpus must be a number"),
    (dict(num_gpus=float("inf")), "num_gpus must be a number"),
    (dict(num_cpus=0.00001), "0 or at least 0.0001"),
    (dict(memory=1.5), "memory"),
    (dict(memory=-1), "memory"),
    (dict(resources=[("special", 1)]), "resources must be a dict"),
    (dict(resources={"special": -1}), "resource 'special' must be a number >= 0"),
    (dict(resources={1: 1}), "resource names must be non-empty str"),
    (dict(resources={"CPU": 1}), "with num_cpus="),
    (dict(resources={"GPU": 1}), "with num_gpus="),
    (dict(runtime_env="env.yaml"), "runtime_env must be a dict"),
    (dict(runtime_env={1: "x"}), "runtime_env must be a dict with str keys"),
    (dict(runtime_env={"env_vars": {"A": object()}}), "runtime_env must hold msgpack-able"),
    (dict(runtime_env={"working_dir": "."}), "working_dir must be a URI or an absolute path"),
    (dict(runtime_env={"working_dir": 3}), "working_dir must be a URI or an absolute path"),
])
def test_bad_ray_options_are_refused_with_a_clear_error(fields, error):
    with pytest.raises(InvalidMessage, match=error):
        TaskSpec("t", "tasks", **fields)
    with pytest.raises(InvalidMessage, match=error):
        task(**fields)(lambda: None)


def test_the_decorator_takes_the_ray_options():
    @task(type="gpu", num_gpus=1, resources={"special": 2}, runtime_env={"env_vars": {"A": "b"}})
    def train():
        return 1

    assert train.spec == TaskSpec("gpu", "tasks", num_gpus=1, resources={"special": 2.0},
                                  runtime_env={"env_vars": {"A": "b"}})
    assert (train.spec.num_cpus, train.spec.memory) == (None, None)


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


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", b"not msgpack \xc1"])
def test_a_malformed_usage_report_is_refused_clearly(data):
    from rayq.core.codec.tasks import UsageReport
    with pytest.raises(InvalidMessage):
        UsageReport.unpack(data)
