"""Hit-rate load balancing for consumers (docs/consumer-balancing.md).

Each consumer has a *load* in ``[min_load, max_load]`` (here: how many pollers
it runs at once) and keeps a moving average of its polling hit rate (receives
that found a message / receives attempted). The source text's reads do not
block, so a hit is a message that was there when the consumer looked: a long
poll that had to wait longer than ``hit_wait_s`` for its message counts as a
miss (:func:`is_hit`). Counting every answered long poll as a hit would make
nearly every poll a hit under light steady traffic, and every consumer would
climb to ``max_load``. The load maps linearly onto a
target hit rate in ``[min_target, max_target]``; a consumer whose observed hit
rate is above its target takes on more load, one below takes on less.

Consumers never talk to each other: the hit rate they all observe on the same
queue is their only signal. A heavily loaded consumer has a high target, so
when a newcomer adds polls and the hit rate falls, the heavy one backs off
first and the newcomer grows until both sit at the same target, that is, the
same load. On an empty queue the hit rate is 0, below every target, so every
consumer falls to ``min_load`` and stops hammering the shards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rayq.config import ConsumerConfig


def is_hit(received: int, waited_s: float, config: ConsumerConfig) -> bool:
    """A receive that got ``received`` tasks after a long-poll wait of ``waited_s``
    seconds is a hit when it got some within ``config.hit_wait_s``."""
    return received > 0 and waited_s <= config.hit_wait_s


def target_hit_rate(load: int, config: ConsumerConfig) -> float:
    """The hit rate a consumer at ``load`` aims for: the load's place in its range,
    mapped onto the target range."""
    span = config.max_load - config.min_load
    place = 1.0 if span <= 0 else (load - config.min_load) / span
    return config.min_target + place * (config.max_target - config.min_target)


def smoothed(hit_rate: float, hits: int, attempts: int, weight: float) -> float:
    """The moving average after one period of ``hits`` out of ``attempts`` polls."""
    if attempts <= 0:
        return hit_rate
    return (1.0 - weight) * hit_rate + weight * (hits / attempts)


def next_load(hit_rate: float, load: int, config: ConsumerConfig) -> int:
    """One step toward the target: +1 above it, -1 below it, bounded by the load range."""
    target = target_hit_rate(load, config)
    if hit_rate > target:
        return min(load + 1, config.max_load)
    if hit_rate < target:
        return max(load - 1, config.min_load)
    return load


@dataclass(frozen=True)
class BalancerState:
    """One consumer's balancer: its load, its smoothed hit rate and this period's polls."""

    load: int
    hit_rate: float
    hits: int = 0
    attempts: int = 0

    @classmethod
    def initial(cls, config: ConsumerConfig) -> "BalancerState":
        # Start at the bottom: a newcomer earns its load from the hit rate it observes.
        return cls(load=config.min_load, hit_rate=target_hit_rate(config.min_load, config))

    def polled(self, hit: bool) -> "BalancerState":
        return replace(self, hits=self.hits + bool(hit), attempts=self.attempts + 1)

    def adjusted(self, config: ConsumerConfig) -> "BalancerState":
        """Close the period: fold its polls into the average and move the load."""
        rate = smoothed(self.hit_rate, self.hits, self.attempts, config.smoothing)
        load = next_load(rate, self.load, config) if self.attempts else self.load
        return BalancerState(load=load, hit_rate=rate)


@dataclass(frozen=True)
class HostReading:
    """The consumer's host now: memory in use and CPU busy, in percent."""

    memory_percent: float
    cpu_percent: float


def host_pressed(reading: HostReading, config: ConsumerConfig) -> bool:
    """The host is over a limit: the consumer backs off and defers what it received
    (docs/fairness-coordinator.md: its source's "lazy message queue" events count as
    deferrals of the key)."""
    return (reading.memory_percent > config.max_host_memory_percent
            or reading.cpu_percent > config.max_host_cpu_percent)
