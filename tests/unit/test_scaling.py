"""Subqueue scaling decisions of rayq.core.scaling (seed 003), as tables of observed load."""

import pytest

from rayq.config import ScalingConfig
from rayq.core.model import SubqueueState
from rayq.core.scaling import ScalingDecision, SubqueueLoad, decide, least_loaded_shard

ALL, NO_PUT, DISABLED = SubqueueState.ALL, SubqueueState.NO_PUT, SubqueueState.DISABLED
CONFIG = ScalingConfig(scale_up_ops_per_s=100.0, scale_up_throttled_per_s=1.0,
                       idle_ops_per_s=1.0, idle_s=60.0, max_subqueues=3)
DEPTHS = {0: 50, 1: 10, 2: 30}  # shard 1 is the least loaded


def _load(id_, state=ALL, count=0, ops=0.0, throttled=0.0, version=None, shard=0):
    return SubqueueLoad(id_, shard, state, id_ if version is None else version, count, ops, throttled)


@pytest.mark.parametrize("depths, expected", [
    ({0: 5, 1: 3, 2: 9}, 1), ({0: 0, 1: 0}, 0), ({3: 7, 2: 7, 5: 1}, 5), ({4: 0}, 4),
])
def test_the_least_loaded_shard_has_the_fewest_messages_lowest_index_on_ties(depths, expected):
    assert least_loaded_shard(depths) == expected


@pytest.mark.parametrize("loads, min_subqueues, idle_for_s, expected", [
    # busy by operations or by throttling: add a subqueue on the least loaded shard
    ([_load(1, ops=100.0)], 1, 0.0, ScalingDecision(add_on_shard=1)),
    ([_load(1, ops=5.0), _load(2, ops=250.0)], 1, 0.0, ScalingDecision(add_on_shard=1)),
    ([_load(1, throttled=1.0)], 1, 0.0, ScalingDecision(add_on_shard=1)),
    # just under both thresholds: nothing
    ([_load(1, ops=99.9, throttled=0.9)], 1, 0.0, ScalingDecision()),
    # busy but already at max_subqueues live ones: no more
    ([_load(1, ops=500.0), _load(2), _load(3)], 1, 0.0, ScalingDecision()),
    ([_load(1, ops=500.0), _load(2), _load(3, NO_PUT, count=4)], 1, 0.0, ScalingDecision()),
    # a drained retired subqueue is dropped, which frees a place for the busy queue
    ([_load(1, ops=500.0), _load(2), _load(3, NO_PUT)], 1, 0.0,
     ScalingDecision(add_on_shard=1, drop=(3,))),
    # a disabled subqueue does not count against max_subqueues
    ([_load(1, ops=500.0), _load(2), _load(3, DISABLED)], 1, 0.0, ScalingDecision(add_on_shard=1)),
    # load on a draining subqueue is not a reason to scale up
    ([_load(1), _load(2, NO_PUT, count=9, ops=900.0)], 1, 0.0, ScalingDecision()),
])
def test_a_busy_queue_gains_a_subqueue_up_to_the_maximum(loads, min_subqueues, idle_for_s, expected):
    assert decide(loads, DEPTHS, min_subqueues=min_subqueues, idle_for_s=idle_for_s,
                  config=CONFIG) == expected


@pytest.mark.parametrize("loads, min_subqueues, idle_for_s, expected", [
    # idle long enough above the minimum: retire the emptiest (newest on ties)
    ([_load(1, count=5), _load(2, count=2)], 1, 60.0, ScalingDecision(retire=2)),
    ([_load(1, count=3), _load(2, count=3)], 1, 90.0, ScalingDecision(retire=2)),
    ([_load(1, count=3, version=7), _load(2, count=3, version=1)], 1, 90.0, ScalingDecision(retire=1)),
    # not idle for long enough: keep it
    ([_load(1, count=5), _load(2, count=2)], 1, 59.9, ScalingDecision()),
    # at the queue's minimum, or at one: keep it
    ([_load(1), _load(2)], 2, 600.0, ScalingDecision()),
    ([_load(1)], 0, 600.0, ScalingDecision()),
    # one retirement at a time: wait while another subqueue still drains
    ([_load(1), _load(2), _load(3, NO_PUT, count=1)], 1, 600.0, ScalingDecision()),
    # a drained one is dropped in the same step as the next retirement
    ([_load(1, count=1), _load(2), _load(3, NO_PUT)], 1, 600.0, ScalingDecision(retire=2, drop=(3,))),
])
def test_an_idle_queue_retires_one_subqueue_at_a_time(loads, min_subqueues, idle_for_s, expected):
    assert decide(loads, DEPTHS, min_subqueues=min_subqueues, idle_for_s=idle_for_s,
                  config=CONFIG) == expected
