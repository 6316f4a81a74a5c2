"""Metric labels stay bounded whatever the number of keys."""

from rayq.core.kit.metrics import OTHER, failure_text, per_key, top_keys
from rayq.core.codec.model import KeyDepth


def test_only_the_largest_keys_keep_their_own_label():
    values = {f"tenant-{i}": float(i) for i in range(100)}
    out = top_keys(values, limit=5)
    assert list(out)[:5] == [f"tenant-{i}" for i in (99, 98, 97, 96, 95)]
    assert out[OTHER] == sum(range(95)) and len(out) == 6


def test_few_keys_are_kept_as_they_are():
    assert top_keys({"a": 1.0, "b": 2.0}) == {"b": 2.0, "a": 1.0}


def test_depths_sum_per_key_and_the_oldest_age_wins():
    depths = [KeyDepth(1, "a", 3, 2.0, 0.0, 5.0), KeyDepth(2, "a", 4, 1.0, 0.0, 9.0),
              KeyDepth(1, "b", 1, 0.0, None)]
    assert per_key(depths) == ({"a": 7.0, "b": 1.0}, {"a": 9.0, "b": 0.0})
    assert per_key([]) == ({}, {})


def test_a_failure_reads_with_its_cause_when_it_has_one():
    try:
        raise RuntimeError("commit failed") from OSError(28, "No space left on device")
    except RuntimeError as err:
        chained = err
    assert failure_text(chained) == ("RuntimeError('commit failed') caused by "
                                     "OSError(28, 'No space left on device')")
    assert failure_text(ValueError("x")) == "ValueError('x')"
