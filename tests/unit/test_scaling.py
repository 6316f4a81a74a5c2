"""Scale-down per subqueue (docs/autoscaling.md): small, fast or seldom-throttled subqueues."""

import pytest

from rayq.config import ScalingConfig
from rayq.core.codec.model import SubqueueState
from rayq.core.control.scaling import SubqueueLoad, decide, is_quiet

CONFIG = ScalingConfig(scale_up_ops_per_s=5_000, idle_s=60, small_count=1_000,
                       fast_ops_fraction=0.25, seldom_throttled_per_s=0.1)
SHARDS = {0: 0, 1: 0}


def load(sq, count=0, ops=0.0, throttled=0.0, state=SubqueueState.ALL):
    return SubqueueLoad(sq, sq % 2, state, sq, count, ops, throttled)


@pytest.mark.parametrize("count, ops, throttled, quiet", [
    (10, 3_000.0, 0.0, True),         # small, though busy-ish
    (50_000, 800.0, 0.0, True),       # big but fast: 800 < 1 250 ops/s
    (50_000, 2_000.0, 0.0, False),    # big and near its limit
    (10, 10.0, 0.5, False),           # throttled: not seldom
    (50_000, 0.5, 0.0, True),         # under idle_ops_per_s
])
def test_a_subqueue_is_quiet_when_seldom_throttled_and_small_or_fast(count, ops, throttled, quiet):
    assert is_quiet(load(1, count, ops, throttled), CONFIG) is quiet


def test_a_queue_that_grew_narrows_under_moderate_steady_load():
    # three subqueues at 170 ops/s each (510 in all), quiet for a minute: the old
    # rule (whole queue under 1 op/s) would keep all three for ever
    loads = [load(1, 5_000, 170.0), load(2, 4_000, 170.0), load(3, 6_000, 170.0)]
    quiet = {1: 60.0, 2: 60.0, 3: 60.0}
    d = decide(loads, SHARDS, min_subqueues=1, quiet_for_s=quiet, config=CONFIG)
    assert d.retire == 2  # the smallest


def test_no_retirement_before_every_open_subqueue_was_quiet_long_enough():
    loads = [load(1, 5_000, 170.0), load(2, 4_000, 170.0)]
    assert decide(loads, SHARDS, min_subqueues=1, quiet_for_s={1: 60.0, 2: 59.0},
                  config=CONFIG).retire is None


def test_no_retirement_when_the_others_could_not_take_the_load():
    # 2 x 1 000 ops/s: each fast, but one alone would do 2 000 > 1 250
    loads = [load(1, 5_000, 1_000.0), load(2, 5_000, 1_000.0)]
    assert decide(loads, SHARDS, min_subqueues=1, quiet_for_s={1: 99.0, 2: 99.0},
                  config=CONFIG).retire is None


def test_one_at_a_time_and_never_below_the_minimum():
    draining = [load(1, 10), load(2, 10), load(3, 5, state=SubqueueState.NO_PUT)]
    quiet = {1: 99.0, 2: 99.0}
    assert decide(draining, SHARDS, min_subqueues=1, quiet_for_s=quiet, config=CONFIG).retire is None
    assert decide(draining[:2], SHARDS, min_subqueues=2, quiet_for_s=quiet,
                  config=CONFIG).retire is None
    drained = [load(1, 10), load(2, 10), load(3, 0, state=SubqueueState.NO_PUT)]
    d = decide(drained, SHARDS, min_subqueues=1, quiet_for_s=quiet, config=CONFIG)
    assert d.drop == (3,) and d.retire in (1, 2)


def test_a_busy_subqueue_still_adds_one():
    d = decide([load(1, 10, 6_000.0)], SHARDS, min_subqueues=1, quiet_for_s={}, config=CONFIG)
    assert d.add_on_shard == 0


@pytest.mark.parametrize("config, below, at", [
    (ScalingConfig(), 4_999.0, 5_000.0),  # the default (docs/autoscaling.md: why)
    (ScalingConfig(scale_up_ops_per_s=1_000), 999.0, 1_000.0),  # the source text's figure
])
def test_a_subqueue_serving_the_trigger_rate_gets_a_sibling(config, below, at):
    assert decide([load(1, 10, below)], SHARDS, min_subqueues=1, quiet_for_s={},
                  config=config).add_on_shard is None
    assert decide([load(1, 10, at)], SHARDS, min_subqueues=1, quiet_for_s={},
                  config=config).add_on_shard is not None


@pytest.mark.parametrize("used, expected", [
    ([0], 0),           # one shard: the queue grows on it
    ([0, 0, 0], 0),     # and goes on growing past the shard count
])
def test_scale_out_goes_past_the_number_of_shards(used, expected):
    loads = [SubqueueLoad(i, shard, SubqueueState.ALL, i, 10, 6_000.0, 0.0)
             for i, shard in enumerate(used)]
    d = decide(loads, {0: 0}, min_subqueues=1, quiet_for_s={}, config=CONFIG)
    assert d.add_on_shard == expected


def test_scale_out_prefers_a_shard_on_another_node_then_one_the_queue_lacks():
    loads = [SubqueueLoad(1, 0, SubqueueState.ALL, 1, 10, 6_000.0, 0.0)]
    nodes = {0: "a", 1: "a", 2: "b"}
    d = decide(loads, {0: 0, 1: 0, 2: 500}, min_subqueues=1, quiet_for_s={}, config=CONFIG,
               shard_nodes=nodes)
    assert d.add_on_shard == 2  # another node, though fuller
    d = decide(loads, {0: 0, 1: 0}, min_subqueues=1, quiet_for_s={}, config=CONFIG)
    assert d.add_on_shard == 1  # one node: a shard the queue does not use yet


# -- a busy queue on every shard adds a shard (a writer), up to store.max_shards ----------
BUSY = 6_000.0  # over CONFIG's scale_up_ops_per_s


def on_shard(sq, shard, ops=0.0, state=SubqueueState.ALL):
    return SubqueueLoad(sq, shard, state, sq, 100, ops)


@pytest.mark.parametrize("loads, depths, max_shards, expected", [
    # every shard carries one of the queue's: a new shard, the next index
    ([on_shard(1, 0, BUSY), on_shard(2, 1)], {0: 5, 1: 9}, 4, (2, True)),
    ([on_shard(1, 0, BUSY)], {0: 5}, 2, (1, True)),
    # at the bound: round the shards again, on the one holding fewest of the queue's
    ([on_shard(1, 0, BUSY), on_shard(2, 1)], {0: 5, 1: 9}, 2, (0, False)),
    ([on_shard(1, 0, BUSY), on_shard(2, 1)], {0: 5, 1: 9}, 0, (0, False)),
    # a shard the queue does not use yet takes the subqueue: no new shard
    ([on_shard(1, 0, BUSY)], {0: 5, 1: 9}, 8, (1, False)),
    # a disabled subqueue holds no place on its shard
    ([on_shard(1, 0, BUSY), on_shard(2, 1, state=SubqueueState.DISABLED)], {0: 5, 1: 9}, 8,
     (1, False)),
    # a draining one does: every shard is used
    ([on_shard(1, 0, BUSY), on_shard(2, 1, state=SubqueueState.NO_PUT)], {0: 5, 1: 9}, 8,
     (2, True)),
])
def test_a_busy_queue_with_a_subqueue_on_every_shard_asks_for_a_new_shard_within_the_bound(
        loads, depths, max_shards, expected):
    d = decide(loads, depths, min_subqueues=1, quiet_for_s={}, config=CONFIG,
               max_shards=max_shards)
    assert (d.add_on_shard, d.new_shard) == expected


def test_a_quiet_queue_or_one_at_max_subqueues_asks_for_no_shard():
    quiet = decide([on_shard(1, 0, 10.0)], {0: 5}, min_subqueues=1, quiet_for_s={},
                   config=CONFIG, max_shards=8)
    assert (quiet.add_on_shard, quiet.new_shard) == (None, False)
    full = decide([on_shard(i, 0, BUSY) for i in range(CONFIG.max_subqueues)], {0: 5},
                  min_subqueues=1, quiet_for_s={}, config=CONFIG, max_shards=8)
    assert (full.add_on_shard, full.new_shard) == (None, False)


def test_a_queue_growing_from_one_shard_adds_shards_up_to_the_bound_then_goes_round_them():
    loads, depths, placed = [on_shard(0, 0, BUSY)], {0: 0}, []
    for sq in range(1, 6):
        d = decide(loads, depths, min_subqueues=1, quiet_for_s={},
                   config=ScalingConfig(scale_up_ops_per_s=5_000, max_subqueues=8), max_shards=3)
        if d.new_shard:
            depths[d.add_on_shard] = 0
        loads.append(on_shard(sq, d.add_on_shard, BUSY))
        placed.append((d.add_on_shard, d.new_shard))
    assert placed == [(1, True), (2, True), (0, False), (1, False), (2, False)]


@pytest.mark.parametrize("max_shards", [-1, 257, True, 2.0, "4", None])
def test_a_shard_bound_out_of_range_is_a_configuration_error(max_shards):
    from rayq.config import Config, StoreConfig
    from rayq.errors import ConfigError

    with pytest.raises(ConfigError, match="max_shards"):
        Config(store=StoreConfig(max_shards=max_shards))


@pytest.mark.parametrize("max_shards", [0, 1, 8, 256])
def test_a_shard_bound_from_0_to_256_is_taken(max_shards):
    from rayq.config import Config, StoreConfig

    assert Config(store=StoreConfig(max_shards=max_shards)).store.max_shards == max_shards
