"""Which group commits a shard may run on its event loop (rayq.core.storage.operations)."""

from rayq.core.storage.operations import (SMALL_CALLS, SMALL_PUT_BYTES, SMALL_ROWS,
                                          small_group)


def call(name, *args):
    return (name, args, {}, None)


def test_a_few_small_writes_are_a_small_group():
    assert small_group([call("put", 3, b"x" * 2000), call("receive", 3, 10, 30.0),
                        call("delete", ["r1", "r2"]), call(None)])


def test_a_large_put_receive_or_delete_is_not():
    assert not small_group([call("put", 3, b"x" * (SMALL_PUT_BYTES + 1))])
    assert not small_group([call("receive", 3, SMALL_ROWS + 1, 30.0)])
    assert not small_group([call("delete", ["r"] * (SMALL_ROWS + 1))])


def test_too_many_calls_or_an_unbounded_operation_is_not():
    assert not small_group([call("delete", ["r"])] * (SMALL_CALLS + 1))
    assert not small_group([call("sweep", "t", "acme", 7, 10_000)])
    assert not small_group([call("collect_expired", 10_000)])
