"""The exception tree says whose fault an error is, and a bug of the store is never
passed off as the caller's mistake nor loses a stored message."""

import inspect

import pytest

import rayq
from rayq import errors
from rayq.config import Config, ConsumerConfig, FairnessConfig, StoreConfig, from_dict, load
from rayq.core.storage import layout
from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.storage.store import ShardStore
from rayq.core.codec.wire import encode_messages
from rayq.errors import (ConfigError, InvalidMessage, RuntimeFailure, StoreBug, StoreError,
                         UsageError)
from rayq.testing import FakeClock, memory_store, plenty_of_memory
from rayq.core.storage.writes import MoveMatching, Put, Receive
from tests.contract.helpers import received

# Whose fault each error is: "you" (fix the request), "it" (retry later).
WHOSE_FAULT = [
    ("QueueNotFound", "you"), ("QueueExists", "you"), ("ConfigError", "you"),
    ("InvalidMessage", "you"), ("MessageTooLarge", "you"), ("ReceiptInvalid", "you"),
    ("AuthError", "you"), ("NoEvents", "you"), ("DataDirExposed", "you"), ("KeyExposed", "you"),
    ("QuotaExceeded", "you"), ("TaskNotFound", "you"), ("UnknownLayout", "you"),
    ("QueueDisabled", "it"), ("Overloaded", "it"), ("StoreError", "it"), ("StoreBug", "it"),
    ("StaleEpoch", "it"), ("ReplicaBehind", "it"), ("NotEnoughReplicas", "it"),
    ("OutcomeLost", "it"), ("ResultTimeout", "it"),
    ("Throttled", "you"),
]


def error_classes() -> list[type]:
    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.RayqError) and cls.__module__ == errors.__name__]


@pytest.mark.parametrize("name, fault", WHOSE_FAULT)
def test_each_error_sits_on_the_branch_of_whose_fault_it_is(name, fault):
    cls = getattr(rayq, name)  # exported by the package, too
    assert issubclass(cls, UsageError) == (fault == "you")
    assert issubclass(cls, RuntimeFailure) == (fault == "it")


def test_every_error_but_the_roots_and_task_error_is_on_exactly_one_branch():
    apart = {errors.RayqError, UsageError, RuntimeFailure, errors.TaskError,
             errors.TaskCancelled, errors.TaskTimedOut}  # a task's own errors stand apart
    placed = {cls.__name__ for cls in error_classes() if cls not in apart}
    assert placed == {name for name, _ in WHOSE_FAULT}
    assert not issubclass(errors.TaskError, (UsageError, RuntimeFailure))  # the handler's


def all_subclasses(cls: type) -> set[type]:
    return {cls} | {sub for child in cls.__subclasses__() for sub in all_subclasses(child)}


def test_every_error_class_says_when_it_is_raised():
    import rayq.core.auth.accounts  # noqa: F401  (its AuthError subclasses join the tree)
    import rayq.sqs.errors  # noqa: F401
    classes = {cls for cls in all_subclasses(errors.RayqError) if cls.__module__.startswith("rayq")}
    assert set(error_classes()) <= classes and rayq.core.auth.accounts.SignatureMismatch in classes
    for cls in classes:
        assert (cls.__doc__ or "").startswith("Raised when "), cls.__name__


@pytest.mark.parametrize("name, fault", WHOSE_FAULT)
def test_the_sqs_endpoint_blames_the_sender_exactly_for_usage_errors(name, fault):
    from rayq.sqs.errors import from_rayq
    cls = getattr(errors, name)
    err = cls("x", ()) if cls is errors.ReceiptInvalid else cls("x")
    answer = from_rayq(err)
    assert answer.sender == (fault == "you")
    assert (answer.status < 500) == (fault == "you")


def test_a_disabled_queue_is_a_retryable_503_for_sqs_clients():
    from rayq.sqs.errors import from_rayq
    answer = from_rayq(errors.QueueDisabled("subqueue 3 is being removed"))
    assert (answer.code, answer.status) == ("ServiceUnavailable", 503)


def test_a_quota_passed_is_sqs_over_limit_for_sqs_clients():
    from rayq.sqs.errors import from_rayq
    answer = from_rayq(errors.QuotaExceeded("account 'acme' owns 10 queues, its quota"))
    assert (answer.code, answer.status, answer.sender) == ("OverLimit", 403, True)


def test_config_errors_are_usage_errors_but_not_invalid_messages():
    assert issubclass(ConfigError, UsageError) and not issubclass(ConfigError, InvalidMessage)


@pytest.mark.parametrize("build", [
    lambda: Config(fairness=FairnessConfig(key="colour")),
    lambda: Config(store=StoreConfig(shards=0)),
    lambda: Config(store=StoreConfig(shards="2")),
    lambda: Config(consumers=ConsumerConfig(min_load=3, max_load=2)),
    lambda: Config(fairness=FairnessConfig(dispatch="lifo")),
    lambda: from_dict({"nope": {}}),
    lambda: from_dict({"store": {"shardz": 2}}),
])
def test_bad_configuration_raises_config_error(build):
    with pytest.raises(ConfigError):
        build()


def test_a_config_file_that_is_not_toml_raises_config_error_with_the_parse_error(tmp_path):
    path = tmp_path / "rayq.toml"
    path.write_text("[store\nshards = 2\n")
    with pytest.raises(ConfigError) as raised:
        load(path)
    assert raised.value.__cause__ is not None


def test_the_no_events_error_of_the_report_is_the_tree_s_own():
    from rayq.analytics import report
    assert report.NoEvents is errors.NoEvents


# -- store bugs -------------------------------------------------------------------
@pytest.fixture(params=["lmdb", "memory"])
def store(request, tmp_path):
    if request.param == "lmdb":
        opened = ShardStore(LmdbKV(tmp_path / "shard"), clock=FakeClock(),
                            memory_probe=plenty_of_memory)
    else:
        opened = memory_store()
    yield opened
    opened.close()


def put(store, *values, subqueue=0) -> list[str]:
    messages = [NewMessage(encode_body(v, 1 << 20), "acme", "report", "report") for v in values]
    return store.run(Put(subqueue, encode_messages(messages)))


@pytest.fixture
def buggy_receive(monkeypatch):
    """Make the receive path fail the way a bug would: a TypeError deep inside."""
    def broken(*args, **kwargs):
        raise TypeError("a bug in the row codec")
    monkeypatch.setattr(layout, "redelivered", broken)
    return monkeypatch


@pytest.mark.parametrize("error", [TypeError, ValueError, KeyError])
def test_a_store_bug_surfaces_as_a_runtime_failure_with_its_cause(store, monkeypatch, error):
    put(store, "a", "b")

    def broken(*args, **kwargs):
        raise error("a bug in the row codec")
    monkeypatch.setattr(layout, "redelivered", broken)
    with pytest.raises(StoreBug) as raised:
        received(store, 0, 10, 30)
    assert isinstance(raised.value, RuntimeFailure) and not isinstance(raised.value, UsageError)
    assert isinstance(raised.value.__cause__, error)


def test_a_store_bug_leaves_the_stored_messages_as_they_were(store, buggy_receive):
    ids = put(store, "a", "b")
    with pytest.raises(StoreBug):
        received(store, 0, 10, 30)
    buggy_receive.undo()
    assert store.count(0) == 2
    got = received(store, 0, 10, 30)
    assert [m.id for m in got] == ids and [m.dequeue_count for m in got] == [1, 1]


def test_a_store_bug_in_a_group_commit_aborts_the_whole_transaction(store, buggy_receive):
    put(store, "kept")
    batch = encode_messages([NewMessage(encode_body("new", 1 << 20), "acme", "report", "report")])
    with pytest.raises(StoreBug) as raised:
        store.group([Put(0, batch), Receive(0, 1, 30)])
    assert isinstance(raised.value.__cause__, TypeError)
    buggy_receive.undo()
    assert store.count(0) == 1  # the put of the failed transaction was not stored
    assert [m.body for m in received(store, 0, 10, 30)] == [encode_body("kept", 1 << 20)]


def test_fields_that_do_not_fit_a_write_are_the_caller_s_fault_alone(store):
    put(store, "a")
    batch = encode_messages([NewMessage(encode_body("b", 1 << 20), "acme", "report", "report")])
    misfit, bad_after, not_a_write, ids = store.group([
        Receive(0, keys="not a list of keys"),
        MoveMatching(0, 1, "report", "acme", 10, "not a row key"),
        ("receive", (0,), {}),
        Put(0, batch),
    ])
    assert isinstance(misfit, InvalidMessage) and "keys" in str(misfit)
    assert isinstance(bad_after, InvalidMessage)
    assert isinstance(not_a_write, InvalidMessage) and "not a write" in str(not_a_write)
    assert len(ids) == 1 and store.count(0) == 2  # the valid write of the group committed


def test_an_engine_failure_is_a_store_error_not_a_bug(store):
    def broken(txn):
        raise OSError("disk gone")
    with pytest.raises(StoreError) as raised:
        store.group([], also=broken)
    assert not isinstance(raised.value, StoreBug)
    assert isinstance(raised.value.__cause__, OSError)
