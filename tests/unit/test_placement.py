"""Placement policies of rayq.core.control.registry: where producers put, where consumers receive
(table rows; the namespace and migration tests are in test_registry.py)."""

import pytest

from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueInfo, SubqueueInfo, put_target, receive_order
from rayq.errors import QueueDisabled

ALL, NO_PUT, DISABLED = SubqueueState.ALL, SubqueueState.NO_PUT, SubqueueState.DISABLED


def _queue(*subqueues: tuple) -> QueueInfo:
    """A queue from (id, state, version[, dedicated]) rows, all on shard 0."""
    return QueueInfo("q", tuple(SubqueueInfo(i, 0, state, version, *rest)
                                for i, state, version, *rest in subqueues),
                     1, None, (), 0.0)


@pytest.mark.parametrize("subqueues, counts, expected", [
    ([(1, ALL, 0), (2, ALL, 1)], {1: 5, 2: 3}, 2),             # the emptiest, not the first
    ([(1, ALL, 0), (2, ALL, 1)], {1: 3, 2: 5}, 1),
    ([(1, ALL, 0), (2, ALL, 1), (3, ALL, 2)], {1: 9, 2: 0, 3: 4}, 2),
    ([(1, ALL, 1), (2, ALL, 0)], {1: 4, 2: 4}, 2),             # a tie goes to the oldest version
    ([(1, ALL, 0), (2, ALL, 1)], {1: 7}, 2),                   # an unreported subqueue counts as empty
    ([(1, NO_PUT, 0), (2, ALL, 1)], {1: 0, 2: 50}, 2),         # draining takes no puts
    ([(1, DISABLED, 0), (2, ALL, 1)], {1: 0, 2: 50}, 2),       # nor does a disabled one
    ([(1, ALL, 0, ("t", "x")), (2, ALL, 1)], {1: 0, 2: 50}, 2),  # nor a flooder's dedicated one
])
def test_a_producer_is_placed_on_the_emptiest_subqueue_taking_puts(subqueues, counts, expected):
    assert put_target(_queue(*subqueues), counts).id == expected


@pytest.mark.parametrize("subqueues", [
    [], [(1, NO_PUT, 0)], [(1, DISABLED, 0)], [(1, ALL, 0, ("t", "x")), (2, NO_PUT, 1)],
])
def test_a_queue_with_no_subqueue_taking_puts_refuses_producers(subqueues):
    with pytest.raises(QueueDisabled):
        put_target(_queue(*subqueues), {})


@pytest.mark.parametrize("subqueues, counts, expected", [
    ([(1, ALL, 0), (2, ALL, 1), (3, ALL, 2)], {1: 1, 2: 9, 3: 4}, [2, 3, 1]),  # fullest first
    ([(1, ALL, 0), (2, NO_PUT, 1)], {1: 9, 2: 1}, [2, 1]),     # draining before fuller open ones
    ([(1, ALL, 0), (2, DISABLED, 1)], {1: 0, 2: 9}, [1]),      # disabled ones are not read
    ([(1, ALL, 0, ("t", "x")), (2, ALL, 1)], {1: 99, 2: 0}, [2, 1]),  # a flooder's backlog last
    ([(1, ALL, 2), (2, ALL, 0), (3, ALL, 1)], {}, [2, 3, 1]),  # equal counts: oldest version first
    ([(1, NO_PUT, 0, ("t", "x")), (2, NO_PUT, 1)], {1: 5, 2: 1}, [2, 1]),
])
def test_consumers_receive_from_draining_then_fullest_subqueues(subqueues, counts, expected):
    assert [s.id for s in receive_order(_queue(*subqueues), counts)] == expected
