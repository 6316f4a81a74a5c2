"""The hit-rate balancer of docs/consumer-balancing.md: target mapping, load steps, convergence."""

import pytest

from rayq.config import ConsumerConfig
from rayq.core.consumers.balancer import BalancerState, next_load, smoothed, target_hit_rate
from rayq.testing import SimulatedConsumers

CONFIG = ConsumerConfig(min_load=1, max_load=8, min_target=0.2, max_target=0.9, smoothing=0.3)


@pytest.mark.parametrize("load, target", [(1, 0.2), (8, 0.9), (4.5, 0.55), (2, 0.3)])
def test_the_load_maps_linearly_onto_the_target_range(load, target):
    assert target_hit_rate(load, CONFIG) == pytest.approx(target)


@pytest.mark.parametrize("hit_rate, load, expected", [
    (0.95, 8, 8),   # above target at the top: stays at max
    (0.95, 4, 5),   # above target: more load
    (0.10, 4, 3),   # below target: less load
    (0.00, 1, 1),   # empty queue at the bottom: stays at min
    (0.20, 1, 1),   # exactly on target: no change
])
def test_load_moves_one_step_toward_the_target(hit_rate, load, expected):
    assert next_load(hit_rate, load, CONFIG) == expected


def test_the_hit_rate_is_a_moving_average_and_a_silent_period_keeps_it():
    assert smoothed(0.5, 10, 10, 0.3) == pytest.approx(0.65)
    assert smoothed(0.5, 0, 0, 0.3) == 0.5
    state = BalancerState(load=3, hit_rate=0.5)
    assert state.adjusted(CONFIG) == state  # no polls: nothing learned, nothing moved


def test_a_new_consumer_starts_at_the_minimum_load():
    assert BalancerState.initial(CONFIG).load == CONFIG.min_load


def _within(shares, tolerance):
    mean = sum(shares) / len(shares)
    return all(abs(s - mean) <= tolerance * mean for s in shares)


@pytest.mark.parametrize("arrivals", [12, 20, 40])  # 40 > 4 x 8 polls: saturated
def test_four_consumers_converge_to_even_shares(arrivals):
    sim = SimulatedConsumers(CONFIG, seed=arrivals)
    for _ in range(4):
        sim.join()
    sim.run(200, arrivals)  # converge
    shares = sim.run(400, arrivals)
    assert sum(shares) > 0
    assert _within(shares, 0.15), shares


def test_a_fifth_consumer_joins_and_shares_reconverge():
    sim = SimulatedConsumers(CONFIG, seed=5)
    for _ in range(4):
        sim.join()
    sim.run(200, 20)
    newcomer = sim.join()
    assert sim.states[newcomer].load == CONFIG.min_load
    sim.run(200, 20)
    shares = sim.run(400, 20)
    assert len(shares) == 5
    assert _within(shares, 0.15), shares


def test_an_empty_queue_drives_every_consumer_to_its_minimum_load():
    sim = SimulatedConsumers(CONFIG, seed=1)
    for _ in range(4):
        sim.join()
    sim.run(100, 40)  # busy: loads climb
    assert all(s.load == CONFIG.max_load for s in sim.states)
    sim.depth = 0
    sim.run(100, 0)
    assert [s.load for s in sim.states] == [CONFIG.min_load] * 4


def test_balanced_consumers_poll_an_empty_queue_far_less_than_fixed_ones():
    balanced = SimulatedConsumers(CONFIG, seed=2)
    for _ in range(4):
        balanced.join()
    balanced.run(100, 0)
    fixed_empty_polls = 4 * CONFIG.max_load * 100  # fixed-rate pollers at max load, same period
    assert balanced.empty_polls < fixed_empty_polls / 4
