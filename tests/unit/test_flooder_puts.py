"""The flooder put policy on a fake clock: a bucket per flooder, refilled at its rate."""

import pytest

from rayq.config import Config, FloodConfig
from rayq.core.storage.spill import FlooderPuts
from rayq.errors import ConfigError, Throttled

S = 1_000_000  # µs


@pytest.mark.parametrize("steps, admitted", [
    # (µs since start, messages) per put: rate 10/s, burst 5
    ([(0, 5), (0, 1)], [True, False]),                 # the burst spent, then refused
    ([(0, 3), (0, 9), (0, 1)], [True, True, False]),   # a batch is never split: into debt
    ([(0, 5), (S // 10, 1)], [True, True]),            # a tenth of a second: one back
    ([(0, 20), (S, 1), (2 * S + S // 10, 1)], [True, False, True]),  # 15 in debt: 1.5 s
    ([(0, 1), (100 * S, 5), (100 * S, 1)], [True, True, False]),  # never above the burst
])
def test_a_throttled_flooder_gets_its_rate_and_burst(steps, admitted):
    policy = FlooderPuts("throttle", rate_per_s=10.0, burst=5)
    got = []
    for at, count in steps:
        try:
            policy.admit("report", "acme", count, at)
            got.append(True)
        except Throttled:
            got.append(False)
    assert got == admitted


def test_each_flooder_has_its_own_bucket_and_an_unlisted_one_starts_full_again():
    policy = FlooderPuts("throttle", rate_per_s=1.0, burst=1)
    policy.admit("report", "acme", 1, 0)
    policy.admit("report", "other", 1, 0)     # its own bucket
    policy.admit("email", "acme", 1, 0)       # another type: another flooder
    with pytest.raises(Throttled):
        policy.admit("report", "acme", 1, 0)
    policy.forget_others({("email", "acme")})  # report/acme no longer listed
    policy.admit("report", "acme", 1, 0)


@pytest.mark.parametrize("mode, refused", [("spill", False), ("block", True)])
def test_spill_admits_everything_and_block_nothing(mode, refused):
    policy = FlooderPuts(mode, rate_per_s=1.0, burst=1)
    if refused:
        with pytest.raises(Throttled):
            policy.admit("report", "acme", 1, 0)
    else:
        for _ in range(1000):
            policy.admit("report", "acme", 1000, 0)


@pytest.mark.parametrize("fields", [{"flooder_puts": "drop"}, {"flooder_rate_per_s": 0},
                                    {"flooder_burst": 0}, {"flooder_burst": 1.5},
                                    {"flooder_burst": True}])
def test_bad_flooder_put_settings_are_refused(fields):
    with pytest.raises(ConfigError):
        Config(flood=FloodConfig(**fields))


def test_the_policy_follows_the_flood_config():
    policy = FlooderPuts.of(FloodConfig(flooder_puts="throttle", flooder_rate_per_s=3.0,
                                        flooder_burst=7))
    assert (policy.mode, policy.rate_per_s, policy.burst) == ("throttle", 3.0, 7)


def test_the_sqs_endpoint_answers_a_throttled_put_with_sqs_throttling_code():
    from rayq.sqs.errors import from_rayq
    err = from_rayq(Throttled("tenant 'acme' is listed as a flooder"))
    assert (err.code, err.status, err.sender) == ("RequestThrottled", 400, True)
