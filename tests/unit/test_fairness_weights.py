"""Weights in the fair expected usage of docs/fairness-coordinator.md: a key of weight w
is entitled to w
times the thread time of a key of weight 1 over the windows they both waited."""

import pytest

from rayq.config import Config, FairnessConfig
from rayq.core.fairness.policy import KeyState, UsageTable, evaluate
from rayq.errors import ConfigError


def both_waiting_all_along(now: float) -> dict[str, KeyState]:
    return {k: KeyState(k, latency_s=now, oldest_enqueued_at=0.0) for k in ("gold", "free")}


def test_expected_usage_follows_the_weights():
    now = 1800.0
    usage = {"gold": [50.0] * 6, "free": [150.0] * 6}  # 1200 s used between them
    config = FairnessConfig(weights={"gold": 3})
    d = evaluate(UsageTable(300, 0.0, usage), both_waiting_all_along(now), now, config, threads=1)
    assert d.expected_s["gold"] == pytest.approx(900) and d.expected_s["free"] == pytest.approx(300)
    assert "gold" in d.usage_victims and "free" in d.offenders


def test_an_even_split_is_fair_only_without_weights():
    now = 1800.0
    usage = {"gold": [100.0] * 6, "free": [100.0] * 6}
    d = evaluate(UsageTable(300, 0.0, usage), both_waiting_all_along(now), now, FairnessConfig(),
                 threads=1)
    assert d.fair_users == {"gold", "free"}


@pytest.mark.parametrize("weights", [{"k": 0}, {"k": -1}, {"k": "2"}, {"k": True}])
def test_weights_must_be_positive_numbers(weights):
    with pytest.raises(ConfigError):
        Config(fairness=FairnessConfig(weights=weights))


def test_dispatch_takes_fair_or_fifo_only():
    with pytest.raises(ConfigError):
        Config(fairness=FairnessConfig(dispatch="lifo"))
