"""Task values on real Ray: arrays, Arrow tables, tuples, datetimes, Decimals, UUIDs and
ObjectRefs as arguments and results, through a running runtime; bodies far above a queue
message's 16 MiB, and the 256 MiB limit."""

import datetime
import decimal
import uuid

import numpy as np
import pyarrow as pa
import pytest
import ray

import rayq
from rayq.config import Config, ConsumerConfig
from tests.integration.conftest import start_runtime
from tests.unit.test_values import same

try:
    import pandas as pd
except ImportError:
    pd = None

CONFIG = Config(consumers=ConsumerConfig(count=2, poll_wait_s=0.5, adjust_interval_s=0.2))
MiB = 1 << 20


@rayq.task(type="values-echo")
def echo(*args, **kwargs):
    return args, kwargs


@rayq.task(type="values-double")
def double(array):
    return array * 2, array.flags.writeable


@rayq.task(type="values-describe")
def describe(value):
    """What the consumer's handler was given, told in plain values."""
    if isinstance(value, np.ndarray):
        return [type(value).__name__, value.dtype.str, list(value.shape), float(value.sum())]
    if isinstance(value, pa.Table):
        return [type(value).__name__, value.num_rows, value.schema.names]
    return [type(v).__qualname__ for v in value]


@rayq.task(type="values-oversized", max_receives=3)
def oversized():
    return np.zeros(257 * MiB, np.uint8)  # calloc'd pages: refused before any is copied


@rayq.task(type="values-objects", max_receives=3)
def objects():
    return np.array([object()], dtype=object)


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, CONFIG, name="values")
    yield client


def test_a_million_element_float64_array_round_trips_exactly_as_argument_and_result(client):
    array = np.random.default_rng(7).standard_normal(1_000_000)
    assert ray.get(client.submit(describe, array), timeout=120) == [
        "ndarray", "<f8", [1_000_000], float(array.sum())]
    (args, kwargs) = ray.get(client.submit(echo, array, also=array[::2]), timeout=120)
    assert same(args, (array,)) and same(kwargs, {"also": np.ascontiguousarray(array[::2])})
    doubled, writeable = ray.get(client.submit(double, array), timeout=120)
    assert same(doubled, array * 2)
    assert writeable is False  # arrays are read in place from the received bytes


def test_a_hundred_thousand_row_arrow_table_round_trips_exactly(client):
    rows = 100_000
    table = pa.table({"id": pa.array(np.arange(rows)), "x": pa.array(np.linspace(0, 1, rows)),
                      "name": [f"row {i}" for i in range(rows)],
                      "at": pa.array(np.arange(rows), pa.timestamp("us", "UTC"))},
                     metadata={b"source": b"test"})
    assert ray.get(client.submit(describe, table), timeout=120) == [
        "Table", rows, ["id", "x", "name", "at"]]
    (args, _), = [ray.get(client.submit(echo, table, table.to_batches()[0]), timeout=120)]
    assert same(args, (table, table.to_batches()[0]))


def test_tuples_datetimes_decimals_and_uuids_come_back_as_themselves(client):
    mix = ((1, ("nested", 2.5)), datetime.datetime(2024, 5, 6, 7, 8, 9, 123456),
           datetime.datetime(2024, 5, 6, 7, 8, 9, 1, tzinfo=datetime.timezone.utc),
           datetime.datetime(2024, 5, 6, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
           datetime.date(2024, 2, 29), datetime.timedelta(microseconds=-1),
           decimal.Decimal("12345678901234567890.000000001"), uuid.uuid4(),
           np.float32(0.1), np.datetime64("2024-01-01T00:00:00.000000001"),
           {"key": (1, 2), (3, 4): "tuple key"})
    assert ray.get(client.submit(describe, mix), timeout=120) == [
        "tuple", "datetime", "datetime", "datetime", "date", "timedelta", "Decimal", "UUID",
        "float32", "datetime64", "dict"]
    assert same(ray.get(client.submit(echo, *mix, kw=mix), timeout=120), (mix, {"kw": mix}))


@pytest.mark.skipif(pd is None, reason="pandas is not installed: DataFrames are not carried")
def test_a_pandas_dataframe_round_trips(client):
    frame = pd.DataFrame({"a": np.arange(1000), "b": [f"v{i}" for i in range(1000)]},
                         index=pd.RangeIndex(5, 1005, name="row"))
    (args, _) = ray.get(client.submit(echo, frame), timeout=120)
    assert same(args, (frame,))


@ray.remote(num_cpus=0)
class Owner:
    """Owns the objects it puts: they go when it does."""

    def put(self, value):
        return [ray.put(value)]  # in a list: the caller gets the ref, not the value


def test_an_object_ref_argument_is_read_at_submit_and_stored_with_the_task(client):
    array = np.arange(10_000, dtype=np.int32)
    owner = Owner.remote()
    [ref] = ray.get(owner.put.remote(array), timeout=60)
    [nested] = ray.get(owner.put.remote((datetime.date(2020, 1, 1), "x")), timeout=60)
    task = client.submit(echo, ref, {"inner": [nested]}, kw=nested, delay_s=2.0)
    ray.kill(owner)  # the objects' owner is gone before the task runs: it needs none of them
    (args, kwargs) = ray.get(task, timeout=120)
    assert same(args, (array, {"inner": [(datetime.date(2020, 1, 1), "x")]}))
    assert same(kwargs, {"kw": (datetime.date(2020, 1, 1), "x")})


def test_an_object_ref_that_cannot_be_read_is_refused_at_submit(client):
    @ray.remote
    def fails():
        raise ValueError("no value")

    with pytest.raises(rayq.InvalidMessage, match="ObjectRef"):
        client.submit(echo, fails.remote())


def test_a_64_mib_array_round_trips_as_argument_and_result(client):
    array = np.arange(64 * MiB // 8, dtype=np.float64).reshape(-1, 1024)
    doubled, _ = ray.get(client.submit(double, array), timeout=300)
    assert doubled.shape == array.shape and doubled.dtype == array.dtype
    assert np.array_equal(doubled, array * 2)


def test_a_call_over_256_mib_is_refused_with_message_too_large_before_anything_is_stored(client):
    tasks = client.queue("tasks")
    before = tasks.count()
    with pytest.raises(rayq.MessageTooLarge):
        client.submit(echo, np.zeros(257 * MiB, np.uint8))  # calloc'd: nothing is copied
    with pytest.raises(rayq.InvalidMessage, match="dtype object"):
        client.submit(echo, np.array([1, "a"], dtype=object))
    with pytest.raises(rayq.InvalidMessage, match="set"):
        client.submit(echo, {1, 2})
    assert tasks.count() == before


def test_a_result_that_cannot_go_fails_the_task_once_without_a_retry(client):
    for fn, error_type, named in [(oversized, "MessageTooLarge", "too large"),
                                  (objects, "InvalidMessage", "dtype object")]:
        ref = client.submit(fn)
        with pytest.raises(rayq.TaskError) as err:
            ray.get(ref, timeout=120)
        assert err.value.error_type == error_type and named in err.value.error_message
        info = client.task(client.task_id(ref))
        assert (info.state, info.attempts) == ("failed", 1)
