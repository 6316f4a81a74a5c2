"""A consumer's bookkeeping (rayq.core.consumers.state) on a fake clock, and its
balancer over long polls (docs/consumer-balancing.md) with simulated consumers."""

import dataclasses

import pytest

from rayq.config import Config, ConsumerConfig, FairnessConfig
from rayq.core.codec.model import StoredMessage
from rayq.core.codec.tasks import UsageReport, DeferralCause, Outcome, TaskSpec
from rayq.core.consumers.balancer import is_hit, target_hit_rate
from rayq.core.consumers.state import ConsumerState
from rayq.testing import FakeClock, SimulatedLongPolls

CONFIG = ConsumerConfig(min_load=1, max_load=8, min_target=0.2, max_target=0.9,
                        poll_wait_s=2.0, hit_wait_s=0.05, defer_s=0.5)


def state(config: ConsumerConfig = CONFIG, **fairness) -> ConsumerState:
    return ConsumerState(0, Config(consumers=config, fairness=FairnessConfig(**fairness)),
                         FakeClock(start=100.0))


@pytest.mark.parametrize("got, waited_s, hit", [
    (1, 0.0, True),     # found by the non-blocking look: the source's hit
    (3, 0.05, True),    # answered within hit_wait_s
    (1, 0.051, False),  # answered after a wait: a non-blocking read would have missed
    (1, 1.9, False),
    (0, 0.0, False),    # nothing
    (0, 2.0, False),    # an empty long poll
])
def test_a_receive_is_a_hit_only_when_it_found_tasks_without_waiting_long(got, waited_s, hit):
    assert is_hit(got, waited_s, CONFIG) is hit
    s = state()
    want = s.claim()
    s.received(want, got, waited_s)
    assert (s.polls, s.hits, s.waited_hits) == (1, int(got > 0), int(got > 0 and not hit))
    assert (s.balancer.hits, s.balancer.attempts) == (int(hit), 1)
    assert (s.held, s.claimed) == (got, 0)
    assert s.stats().empty_polls == int(got == 0)


def test_claims_follow_the_load_and_are_given_back():
    s = state(dataclasses.replace(CONFIG, prefetch=1))
    s.balancer = dataclasses.replace(s.balancer, load=2)
    first, second, third = s.claim(), s.claim(), s.claim()
    assert (first, second, third) == (1, 1, 0)  # the load has room for two
    s.receive_failed(first)
    s.received(second, 1, 0.0)
    assert (s.claimed, s.held) == (0, 1)
    s.released()
    assert s.held == 0


def test_an_adjust_moves_the_load_by_the_periods_hits_and_names_the_pollers_to_start():
    s = state()
    for _ in range(10):
        s.received(s.claim(), 1, 0.0)
        s.released()
    assert s.adjust(pressed=False, running={0}) == [1]  # all hits: one poller more
    assert s.load == 2 and not s.pressed
    assert s.adjust(pressed=True, running={0, 1}) == []  # no polls: nothing learned
    assert s.pressed and s.load == 2
    s.pin(5)
    assert s.load == 5 and s.adjust(False, {0, 1}) == [2, 3, 4]


def test_a_saturated_type_is_left_out_for_defer_s_on_the_clock():
    s = state(key="type")
    s.saturate("report")
    assert s.excluded() == {"report"}
    s.clock.advance(0.5)
    assert s.excluded() == set()
    assert state(key="tenant").excluded() == set()


def test_handler_time_and_reports_come_from_the_clock():
    s = state()
    started = s.started()
    assert s.running == 1
    s.clock.advance(0.25)
    assert s.finished(started) == pytest.approx(0.25) and s.running == 0
    assert s.task_s == pytest.approx(0.25)
    m = StoredMessage("id1", "r", b"", "acme", "report", "report", 2, 90.0, 0)
    first = s.report(m, "tasks", 0.25, Outcome.SUCCEEDED, wait_s=10.0)
    s.deferred()
    second = s.report(m, "tasks", 0.0, Outcome.DEFERRED, wait_s=-1.0,
                      cause=DeferralCause.CONCURRENCY)
    assert (first.usage_s, first.finished_at, first.attempt, first.queue) == (
        0.25, 100.25, 2, "tasks")
    assert (second.wait_s, second.cause) == (0.0, DeferralCause.CONCURRENCY)
    assert s.stats().deferrals == 1
    # as the shard keeps it with the end, and as the coordinator reads it back
    assert UsageReport.unpack(first.pack()) == first
    assert UsageReport.unpack(second.pack()) == second


def test_held_back_reads_the_plan_and_the_host():
    s = state()
    assert s.hold_back(False, "k") is DeferralCause.CANNOT_RUN
    assert s.hold_back(True, "k") is None
    s.adjust(pressed=True, running=())
    assert s.hold_back(True, "k") is DeferralCause.HOST_PRESSURE


def test_handlers_are_adopted_by_version_and_name_their_queues():
    s = state()
    table = {"report": (TaskSpec("report", "tasks"), b"fn"), "mail": (TaskSpec("mail", "io"), b"g")}
    s.adopt_handlers(3, table, load=lambda blob: blob.decode())
    assert s.tasks_version == 3 and s.queues == ["io", "tasks"]
    s.adopt_handlers(4, None, load=lambda blob: 1 / 0)  # None: unchanged
    assert s.tasks_version == 3 and s.handlers["report"][1] == "fn"


# -- the balancer over long polls ---------------------------------------------------------
# Consumers long-poll one queue (2 s); tasks arrive at random. Light steady traffic used to
# pin every consumer at max_load (every answered long poll counted as a hit); measured the
# source's way, loads settle where the observed hit rate meets the load's target, or at a
# bound the hit rate pushes them to.
def settled(sim: SimulatedLongPolls, seconds: float) -> tuple[list[float], list[float]]:
    """Run ``seconds`` more; each consumer's mean load and balancer hit rate over them."""
    before = [(s.polls, s.hits - s.waited_hits) for s in sim.states]
    sim.run(seconds)
    rates = [(s.hits - s.waited_hits - hits) / (s.polls - polls)
             for s, (polls, hits) in zip(sim.states, before)]
    return sim.mean_loads(int(seconds / CONFIG.adjust_interval_s)), rates


@pytest.mark.parametrize("consumers, rate_per_s, task_s, config, loads", [
    (2, 20, 0.02, CONFIG, (1, 2.5)),         # light: near min_load, not 8 and 16 pollers
    (2, 100, 0.02, CONFIG, (4, 8)),
    (4, 100, 0.02, CONFIG, (1.5, 4)),         # more consumers, each less
    (2, 40, 0.2, CONFIG, (3, 7)),
    (2, 1000, 0.02, CONFIG, (7.5, 8)),        # more than 16 pollers can take: max_load
    # every answered long poll a hit (hit_wait_s = poll_wait_s): light traffic pins max_load
    (2, 20, 0.02, dataclasses.replace(CONFIG, hit_wait_s=2.0), (7.5, 8)),
])
def test_loads_settle_where_the_hit_rate_meets_the_loads_target(
        consumers, rate_per_s, task_s, config, loads):
    sim = SimulatedLongPolls(config, consumers, rate_per_s, task_s, seed=rate_per_s)
    sim.run(60.0)  # converge
    mean_loads, rates = settled(sim, 120.0)
    low, high = loads
    assert all(low <= load <= high for load in mean_loads), mean_loads
    for load, rate in zip(mean_loads, rates):
        target = target_hit_rate(load, config)
        at_max = load > config.max_load - 0.5 and rate >= config.max_target
        at_min = load < config.min_load + 0.5 and rate <= config.min_target
        assert at_max or at_min or abs(rate - target) < 0.1, (load, rate, target)
