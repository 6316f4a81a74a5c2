"""The fairness rules of docs/fairness-coordinator.md, with its source's worked examples
as table rows.

Windows are the source's: 5 minutes, 6 of look-back, latency threshold 20
minutes, band 50 %. Usage is in seconds of thread time per window.
"""

import random
from dataclasses import replace

import pytest

from rayq.config import FairnessConfig
from rayq.core.fairness.policy import (KeyState, UsageTable, UsageWindows, evaluate, key_latency,
                                       latency_threshold, listen_order)

CONFIG = FairnessConfig(window_s=300, windows=6, latency_threshold_s=1200, band=0.5)
MIN = 60.0


def table(now, usage, processed=None, deferred=None):
    """Usage lists are oldest window first; the last is the window ``now`` is in."""
    current = int(now // 300)
    return UsageTable(300, (current - 5) * 300, usage, processed or {}, deferred or {})


def waiting(key, since, now, **fields):
    return KeyState(key, latency_s=now - since, oldest_enqueued_at=since, **fields)


# -- M1 floods, M2 trickles one long message every few minutes (zero latency) ---------------
def test_a_zero_latency_trickle_that_took_most_threads_triggers_intervention():
    now = 1250.0  # 20 min 50 s: M1's oldest message has waited past the threshold
    usage = {"M1": [0, 30, 30, 30, 30, 0], "M2": [0, 270, 270, 270, 270, 0]}  # 2 vs 18 minutes
    d = evaluate(table(now, usage), {"M1": waiting("M1", 0.0, now)}, now, CONFIG, threads=1)
    assert d.expected_s["M1"] == pytest.approx(10 * MIN) == pytest.approx(d.expected_s["M2"])
    assert d.intervening and d.victims == {"M1"}
    assert "M2" in d.offenders  # counted against its fair share though nothing of it waits
    order = listen_order(d, ["M2", "M1"], random.Random(0))
    assert order == ["M1", "M2"]  # the trickle is ranked, not put first


def test_a_flood_that_took_most_threads_is_not_penalised_for_a_trickle_of_unknown_wait():
    now = 1250.0
    usage = {"M1": [0, 270, 270, 270, 270, 0], "M2": [0, 30, 30, 30, 30, 0]}  # 18 vs 2 minutes
    d = evaluate(table(now, usage), {"M1": waiting("M1", 0.0, now)}, now, CONFIG, threads=1)
    assert d.expected_s == {"M1": pytest.approx(18 * MIN)}
    assert not d.intervening and not d.offenders and not d.usage_victims


# -- four types: M1 and M4 together deprive M2 ---------------------------------------------
def test_two_types_over_their_share_together_deprive_a_third_who_is_the_victim():
    now = 1799.0  # windows W1..W6 = [0, 300) .. [1500, 1800)
    usage = {"M1": [300, 200, 200, 150, 100, 100], "M2": [0, 100, 100, 0, 0, 0],
             "M3": [0, 0, 0, 75, 75, 75], "M4": [0, 0, 0, 75, 125, 125]}
    pending = {"M1": waiting("M1", 300.0, now), "M2": waiting("M2", 300.0, now),
               "M3": waiting("M3", 900.0, now), "M4": waiting("M4", 900.0, now)}
    d = evaluate(table(now, usage), pending, now, CONFIG, threads=4)
    assert d.expected_s["M1"] == pytest.approx(525) and d.actual_s["M1"] == pytest.approx(750)
    assert d.starvation["M1"] == pytest.approx(-0.43, abs=0.01)  # the source's "-43 %"
    assert d.latency_victims == {"M1", "M2"} and d.usage_victims == {"M2"}
    assert d.fair_users == {"M1", "M3", "M4"} and not d.offenders
    assert d.intervening and d.victims == {"M2"}
    assert listen_order(d, pending, random.Random(1))[0] == "M2"
    assert d.permits == {"M1": 1, "M2": 1}  # both waited past the threshold
    assert listen_order(d, pending, random.Random(1), booster=True)[:2] in (["M1", "M2"], ["M2", "M1"])


# -- concurrency-limited keys ---------------------------------------------------------------
@pytest.mark.parametrize("concurrency, threads, expected_s", [
    (8, 16, 600.0),     # the source: 5 minutes x 16 threads / limit 8
    (None, 16, 300.0),  # no limit: unchanged
    (16, 16, 300.0),    # a limit equal to the threads: unchanged
    (32, 16, 300.0),    # a limit above the threads never binds
])
def test_the_latency_threshold_scales_by_threads_over_the_concurrency_limit(
        concurrency, threads, expected_s):
    state = KeyState("pdf", 0.0, 0.0, concurrency)
    assert latency_threshold(state, 300.0, threads) == expected_s


def test_a_limited_key_waiting_under_its_scaled_threshold_is_no_latency_victim():
    now = 1750.0
    usage = {"pdf": [0, 0, 0, 0, 0, 10], "csv": [0, 0, 0, 0, 0, 10]}
    pending = {"pdf": waiting("pdf", now - 480, now, concurrency=8),
               "csv": waiting("csv", now - 480, now)}
    config = FairnessConfig(window_s=300, windows=6, latency_threshold_s=300)
    d = evaluate(table(now, usage), pending, now, config, threads=16)
    assert d.latency_victims == {"csv"}


def test_a_key_that_defers_its_own_messages_is_expected_to_use_less():
    now = 1799.0
    usage = {"L": [0, 0, 0, 0, 40, 40], "M": [0, 0, 0, 0, 260, 260]}
    pending = {"L": waiting("L", 1200.0, now), "M": waiting("M", 1200.0, now)}
    plain = evaluate(table(now, usage), pending, now, CONFIG, threads=8)
    limited = evaluate(table(now, usage, processed={"L": [0, 0, 0, 0, 2, 2]},
                             deferred={"L": [0, 0, 0, 0, 8, 8]}), pending, now, CONFIG, threads=8)
    assert "L" in plain.usage_victims  # without the deferrals it looks starved
    # 300 x 0.2 = 60 is under the 80 it used: revised up to 80, a fair user, and the
    # other key's share is untouched (the source: "without adversely effecting other types")
    assert limited.expected_s["L"] == pytest.approx(80) and limited.starvation["L"] == 0
    assert limited.expected_s["M"] == pytest.approx(plain.expected_s["M"])
    assert "L" in limited.fair_users


# -- whose usage counts ---------------------------------------------------------------------
def test_a_key_busy_before_another_arrived_is_not_penalised_for_that_earlier_usage():
    now = 1450.0
    usage = {"M1": [0, 300, 300, 300, 300, 150], "M2": [0, 0, 0, 0, 0, 100]}
    pending = {"M1": waiting("M1", 0.0, now), "M2": waiting("M2", 1200.0, now)}
    d = evaluate(table(now, usage), pending, now, CONFIG, threads=1)
    assert d.expected_s["M2"] == pytest.approx(125)  # half of the window they shared
    assert "M1" not in d.offenders and "M2" not in d.usage_victims


def test_a_key_without_pending_messages_does_not_make_others_offenders():
    now = 1250.0
    usage = {"M1": [0, 270, 270, 270, 270, 0], "M2": [0, 30, 30, 30, 30, 0]}
    d = evaluate(table(now, usage), {"M1": waiting("M1", 300.0, now)}, now, CONFIG, threads=2)
    assert not d.offenders and "M2" not in d.expected_s


def test_no_latency_victim_means_no_intervention_however_skewed_the_usage():
    now = 1799.0
    usage = {"A": [0, 0, 0, 0, 290, 290], "B": [0, 0, 0, 0, 10, 10]}
    pending = {"A": waiting("A", 1200.0, now), "B": waiting("B", 1200.0, now)}
    d = evaluate(table(now, usage), pending, now, CONFIG, threads=2)
    assert "B" in d.usage_victims and not d.latency_victims and not d.intervening


def test_suspended_keys_take_no_part():
    now = 1799.0
    usage = {"A": [0, 0, 0, 0, 290, 290], "B": [0, 0, 0, 0, 10, 10]}
    pending = {"A": waiting("A", 300.0, now), "B": waiting("B", 300.0, now)}
    d = evaluate(table(now, usage), pending, now, CONFIG, threads=2, suspended={"B"})
    assert "B" not in d.expected_s and not d.intervening
    assert "B" not in listen_order(d, ["A", "B"], random.Random(0), suspended={"B"})


# -- booster permits --------------------------------------------------------------------------
def test_permits_grow_with_latency_and_offenders_lose_theirs_while_intervening():
    now = 1799.0
    usage = {"hog": [0, 290, 290, 290, 290, 290], "meek": [0, 10, 10, 10, 10, 10],
             "calm": [0, 0, 0, 0, 0, 1]}
    pending = {"hog": waiting("hog", 300.0, now), "meek": waiting("meek", 300.0, now),
               "calm": waiting("calm", now - 100, now)}
    config = FairnessConfig(window_s=300, windows=6, latency_threshold_s=600)
    d = evaluate(table(now, usage), pending, now, config, threads=2)
    assert d.intervening and d.victims == {"meek"} and "hog" in d.offenders
    assert d.permits == {"meek": 2} and d.ignored_permits == {"hog": 2}  # 1499 s / 600 s
    # calm just arrived and got almost nothing of its share of the current window
    assert d.starvation["calm"] > d.starvation["meek"] > 0 > d.starvation["hog"]
    assert listen_order(d, pending, random.Random(3)) == ["calm", "meek", "hog"]
    assert listen_order(d, pending, random.Random(3), booster=True)[0] == "meek"


def test_keys_that_defer_their_own_messages_get_no_permits():
    now = 1799.0
    usage = {"L": [0, 0, 0, 0, 10, 10]}
    d = evaluate(table(now, usage, processed={"L": [0, 0, 0, 0, 1, 1]},
                       deferred={"L": [0, 0, 0, 0, 5, 5]}),
                 {"L": waiting("L", 0.0, now)}, now, CONFIG, threads=4)
    assert "L" in d.latency_victims and d.permits == {}


# -- the listen list ---------------------------------------------------------------------------
def test_without_intervention_the_listen_list_is_a_fair_shuffle():
    keys = ["a", "b", "c", "d"]
    firsts = {listen_order(None, keys, random.Random(seed))[0] for seed in range(40)}
    assert firsts == set(keys)  # every key gets to be first


def test_while_intervening_zero_latency_keys_come_first_then_decreasing_starvation():
    now = 1799.0
    usage = {"A": [0, 0, 0, 0, 280, 280], "B": [0, 0, 0, 0, 15, 15], "C": [0, 0, 0, 0, 5, 5]}
    pending = {"A": waiting("A", 0.0, now), "B": waiting("B", 0.0, now), "C": waiting("C", 0.0, now),
               "Z1": KeyState("Z1", 0.0, now - 1), "Z2": KeyState("Z2", 0.0, now - 1)}
    d = evaluate(table(now, usage), pending, now, CONFIG, threads=3)
    assert d.intervening and set(d.zero_latency) == {"Z1", "Z2"}
    orders = {tuple(listen_order(d, pending, random.Random(s))) for s in range(20)}
    assert {o[2:] for o in orders} == {("C", "B", "A")}
    assert {o[:2] for o in orders} == {("Z1", "Z2"), ("Z2", "Z1")}


def test_usage_windows_sum_reports_per_key_and_count_deferrals_apart():
    windows = UsageWindows(window_s=300, windows=6)
    windows.add("A", 2.0, deferred=False, at=10.0)
    windows.add("A", 3.0, deferred=False, at=320.0)
    windows.add("A", 0.0, deferred=True, at=330.0)
    windows.add("B", 0.0, deferred=True, at=330.0)
    t = windows.table(now=400.0)
    assert t.usage["A"][-2:] == [2.0, 3.0] and t.usage["B"] == [0.0] * 7  # 6 + the oldest in part
    assert t.processed["A"][-1] == 1 and t.deferred["A"][-1] == 1
    assert t.first_window_start == -1500.0 and t.lookback_start == 400.0 - 1800.0


@pytest.mark.parametrize("now, counted", [
    (1800.0, 100.0),   # look-back [0, 1800]: the first window whole
    (1950.0, 50.0),    # [150, 1950]: half of it (a circular array of 6 lost it all)
    (2099.0, 1 / 3),   # [299, 2099]: a 300th of it
    (2100.0, 0.0),     # [300, 2100]: none
])
def test_the_usage_look_back_is_exactly_window_s_times_windows(now, counted):
    windows = UsageWindows(window_s=300, windows=6)
    windows.add("A", 100.0, deferred=False, at=10.0)    # the window [0, 300)
    windows.add("B", 7.0, deferred=False, at=now)       # the current window
    t = windows.table(now=now)
    assert sum(t.usage.get("A", [])) == pytest.approx(counted)
    assert sum(t.usage["B"]) == 7.0
    assert now - t.lookback_start == 1800.0


def test_a_key_waiting_all_along_is_entitled_over_thirty_minutes_not_twenty_five():
    # A waited all along beside B, which used 100 s of every window; at 1950 the
    # look-back [150, 1950] holds half the first window, five whole ones and the current
    # one: 650 s used (a circular array of 6 windows saw 600), A's share half
    windows = UsageWindows(window_s=300, windows=6)
    for start in range(0, 2100, 300):
        windows.add("B", 100.0, deferred=False, at=start + 1.0)
    t = windows.table(now=1950.0)
    waiting = {"A": KeyState("A", 1950.0, 0.0), "B": KeyState("B", 1950.0, 0.0)}
    d = evaluate(t, waiting, 1950.0, FairnessConfig(), threads=1)
    assert d.expected_s["A"] == pytest.approx(650.0 / 2)
    assert d.actual_s["B"] == pytest.approx(650.0)


@pytest.mark.parametrize("b_s, hysteresis, was_on, on", [
    (60, False, False, True),    # B at 20 % of its share: both victims, intervene
    (120, False, True, False),   # 80 %: no usage victim, the source's rule stops
    (120, True, True, True),     # ... the hysteresis keeps an intervention on
    (120, True, False, False),   # ... but never starts one
    (150, True, True, False),    # at its share: off either way
])
def test_an_intervention_needs_a_latency_and_usage_victim_unless_hysteresis_holds_it(
        b_s, hysteresis, was_on, on):
    now = 1799.0
    usage = {"A": [0, 0, 0, 0, 300 - b_s, 300 - b_s], "B": [0, 0, 0, 0, b_s, b_s]}
    pending = {"A": waiting("A", 0.0, now), "B": waiting("B", 0.0, now)}
    config = replace(CONFIG, intervention_hysteresis=hysteresis)
    d = evaluate(table(now, usage), pending, now, config, threads=2, was_intervening=was_on)
    assert d.latency_victims == {"A", "B"}
    assert d.intervening is on


def test_usage_spent_since_the_decision_moves_a_key_down_the_listen_list():
    now = 1799.0
    usage = {"A": [0, 0, 0, 0, 280, 280], "B": [0, 0, 0, 0, 10, 10], "C": [0, 0, 0, 0, 10, 10]}
    pending = {k: waiting(k, 0.0, now) for k in usage}
    d = evaluate(table(now, usage), pending, now, CONFIG, threads=3)
    assert d.intervening
    assert listen_order(d, pending, random.Random(0))[-1] == "A"
    order = listen_order(d, pending, random.Random(0), spent={"B": 150.0})
    assert order == ["C", "B", "A"]


# A message enqueued at 0 that became visible at 1000 (a delay or a retry's back-off);
# the threshold is 1200 s. The source measures the age of the oldest job.
@pytest.mark.parametrize("since, visible_for_s, now, latency_s, victim", [
    ("enqueue", 300.0, 1300.0, 1300.0, True),    # aged 1300 s since its enqueue
    ("visible", 300.0, 1300.0, 300.0, False),    # visible for 300 s only
    ("enqueue", 1199.0, 1199.0, 1199.0, False),  # never delayed: the same either way
    ("visible", 1200.0, 1200.0, 1200.0, True),   # at least the threshold
    ("enqueue", 0.0, 1300.0, 0.0, False),        # nothing visible: nothing waits
])
def test_latency_is_the_age_of_the_oldest_message_since_its_enqueue_unless_set_otherwise(
        since, visible_for_s, now, latency_s, victim):
    state = KeyState("A", latency_s=visible_for_s, oldest_enqueued_at=0.0)
    assert key_latency(state, now, since) == latency_s
    config = replace(CONFIG, latency_since=since)
    d = evaluate(table(now, {"A": [0.0] * 6}), {"A": state}, now, config, threads=2)
    assert ("A" in d.latency_victims) is victim
