"""The source's own figures (docs/fairness-coordinator.md): the deferral revision
(10 dequeued / 2 processed), intervention at exactly the latency threshold, and how
long an intervention lasts.

Windows are the source's: 5 minutes, 6 of look-back, threshold 20 minutes, band 50 %.
"""

from dataclasses import replace

import pytest

from rayq.config import FairnessConfig
from rayq.core.fairness.policy import KeyState, UsageTable, evaluate

CONFIG = FairnessConfig(window_s=300, windows=6, latency_threshold_s=1200, band=0.5)
MIN = 60.0
NOW = 1799.0  # the last of six windows [0, 300) .. [1500, 1800)


def table(usage, processed=None, deferred=None, now=NOW):
    current = int(now // 300)
    return UsageTable(300, (current - 5) * 300, usage, processed or {}, deferred or {})


def waiting(key, since, now=NOW):
    return KeyState(key, latency_s=now - since, oldest_enqueued_at=since)


# Two keys wait over the two last windows, sharing 600 s of thread time: each is
# expected to use 300 s. "Mi" is concurrency limited: of 10 messages dequeued per
# window it ran 2 and deferred 8 (the source's example, "fraction ... to 0.2").
@pytest.mark.parametrize("used_s, deferrals, expected_s, starvation, group", [
    # a usage victim: 100 of 300; revised to 300 x 0.2 = 60 < 100, so up to what it
    # used: a fair user, never an offender
    (100, True, 100, 0.0, "fair_users"),
    # a deep usage victim stays one after the revision: 10 of 60
    (10, True, 60, 50 / 60, "usage_victims"),
    # a fair user (200 of 300) is not revised at all
    (200, True, 300, 1 / 3, "fair_users"),
    # without deferrals the victim is a victim
    (100, False, 300, 2 / 3, "usage_victims"),
])
def test_ten_dequeued_two_processed_revises_only_a_victim_and_never_into_an_offender(
        used_s, deferrals, expected_s, starvation, group):
    half = used_s / 2
    usage = {"Mi": [0, 0, 0, 0, half, half], "M": [0, 0, 0, 0, 300 - half, 300 - half]}
    processed = {"Mi": [0, 0, 0, 0, 2, 2]} if deferrals else {}
    deferred = {"Mi": [0, 0, 0, 0, 8, 8]} if deferrals else {}
    pending = {"Mi": waiting("Mi", 1200.0), "M": waiting("M", 1200.0)}
    d = evaluate(table(usage, processed, deferred), pending, NOW, CONFIG, threads=8)
    assert d.expected_s["Mi"] == pytest.approx(expected_s)
    assert d.starvation["Mi"] == pytest.approx(starvation)
    assert "Mi" in getattr(d, group) and "Mi" not in d.offenders
    assert d.expected_s["M"] == pytest.approx(300)  # the other key's share is untouched


# M1 floods at 0; M2 sends one message every few minutes and never waits. At the
# 20-minute mark M1 used 2 minutes and M2 18: both are expected to use 10, which
# "triggers intervention" (the source). M1's oldest message has then waited exactly 20:00.
@pytest.mark.parametrize("now, intervening", [(1200.0, True), (1199.0, False)])
def test_the_seed_example_intervenes_at_exactly_twenty_minutes(now, intervening):
    usage = {"M1": [0, 30, 30, 30, 30, 0], "M2": [0, 270, 270, 270, 270, 0]}
    if now < 1200:  # one second earlier the windows are those of [-600, 1200)
        usage = {"M1": [0, 0, 30, 30, 30, 30], "M2": [0, 0, 270, 270, 270, 270]}
    d = evaluate(table(usage, now=now), {"M1": waiting("M1", 0.0, now)}, now, CONFIG,
                 threads=1)
    assert d.expected_s["M1"] == pytest.approx(10 * MIN)
    assert d.usage_victims == {"M1"}
    assert d.intervening is intervening and (d.latency_victims == {"M1"}) is intervening
    assert d.permits == ({"M1": 1} if intervening else {})


HYSTERESIS = replace(CONFIG, intervention_hysteresis=True)


# Intervening from 20:00, then M1 recovers: at 80 % of its share it is no usage
# victim any more. The source's rule ends the intervention there; the hysteresis
# setting keeps it on until M1 reaches its share.
@pytest.mark.parametrize("m1_s, config, on", [
    (30, CONFIG, True),         # 2 of 10 minutes: a usage victim, intervening
    (120, CONFIG, False),       # 80 %: no usage victim, the source's rule stops
    (150, CONFIG, False),       # 100 %
    (30, HYSTERESIS, True),
    (120, HYSTERESIS, True),    # 80 %: the hysteresis keeps it on
    (150, HYSTERESIS, False),   # 100 %: at its share, off
])
def test_an_intervention_lasts_while_a_key_is_both_victims_unless_hysteresis_is_set(
        m1_s, config, on):
    usage = {"M1": [0, m1_s, m1_s, m1_s, m1_s, 0],
             "M2": [0, 300 - m1_s, 300 - m1_s, 300 - m1_s, 300 - m1_s, 0]}
    pending = {"M1": waiting("M1", 0.0, 1200.0)}
    d = evaluate(table(usage, now=1200.0), pending, 1200.0, config, threads=1,
                 was_intervening=True)
    assert d.latency_victims == {"M1"}
    assert d.intervening is on
    assert (d.usage_victims == {"M1"}) is (m1_s == 30)