"""A queue's metadata and state in the registry (source text: scalable queues keep
user-defined metadata and a status; a disabled queue refuses puts)."""

from dataclasses import replace

import pytest

from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import (MAX_METADATA_BYTES, QueueRegistry, check_metadata,
                                        metadata_of, put_states)
from rayq.core.kit.clock import FakeClock
from rayq.core.kit.kv import LmdbKV
from rayq.errors import InvalidMessage
from tests.unit.layouts import queue_info


def open_registry(path) -> QueueRegistry:
    return QueueRegistry(LmdbKV(path), shards=2, clock=FakeClock(1000.0))


def test_metadata_and_state_survive_a_restart(tmp_path):
    registry = open_registry(tmp_path / "db")
    registry.create("orders", subqueues=2, max_receives=3, shard_depths={})
    registry.set_metadata("orders", {"owner": "billing", "comment": "monthly runs"})
    registry.set_disabled("orders", True)
    registry.kv.close()
    queue = open_registry(tmp_path / "db").get("orders")
    assert dict(queue.metadata) == {"owner": "billing", "comment": "monthly runs"}
    assert queue.disabled


def test_setting_metadata_replaces_it_and_clearing_keeps_it(tmp_path):
    registry = open_registry(tmp_path / "db")
    registry.create("orders", subqueues=1, max_receives=3, shard_depths={})
    registry.set_metadata("orders", {"a": "1", "b": "2"})
    registry.set_metadata("orders", {"c": "3"})
    registry.set_disabled("orders", True)
    registry.renew("orders")  # a clear gives fresh subqueues, nothing else changes
    queue = registry.get("orders")
    assert dict(queue.metadata) == {"c": "3"} and queue.disabled


@pytest.mark.parametrize("metadata", [
    ["a", "1"],                          # not a mapping
    {"": "x"}, {"a b": "x"}, {"x" * 65: "y"}, {1: "x"},   # names
    {"a": 1}, {"a": None}, {"a": b"x"},  # values are strings
    {"a": "x" * MAX_METADATA_BYTES},     # too large in all
])
def test_malformed_metadata_is_refused(metadata):
    with pytest.raises(InvalidMessage):
        check_metadata(metadata)


def test_metadata_is_kept_sorted_by_name():
    assert check_metadata({"b": "2", "a": "1"}) == (("a", "1"), ("b", "2"))
    assert check_metadata({}) == ()


def test_disabled_must_be_a_bool(tmp_path):
    registry = open_registry(tmp_path / "db")
    registry.create("orders", subqueues=1, max_receives=3, shard_depths={})
    with pytest.raises(InvalidMessage):
        registry.set_disabled("orders", "yes")


# live 1 and 2, 3 draining, 4 a flooder's dedicated one
QUEUE = queue_info("q", {1: 0, 2: 1, 3: 0, 4: 1}, dedicated={4: ("report", "acme")},
                   states={3: SubqueueState.NO_PUT})


@pytest.mark.parametrize("disabled, expected", [
    (True, {1: SubqueueState.NO_PUT, 2: SubqueueState.NO_PUT}),
    (False, {1: SubqueueState.ALL, 2: SubqueueState.ALL}),
])
def test_a_disabled_queues_put_subqueues_refuse_puts_on_their_shards(disabled, expected):
    assert put_states(replace(QUEUE, disabled=disabled)) == expected


def test_the_approximate_count_sums_the_last_counts_read():
    meta = metadata_of(replace(QUEUE, metadata=(("a", "1"),)), {1: 5, 3: 2, 4: 7, 99: 100}, "q")
    assert meta.approximate_count == 14 and meta.metadata == {"a": "1"} and meta.enabled
    assert not metadata_of(replace(QUEUE, disabled=True), {}, "q").enabled
