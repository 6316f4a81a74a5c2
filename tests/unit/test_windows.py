"""WindowedSums: per-key sums over a fixed ring of time windows."""

import pytest

from rayq.core.kit.windows import WindowedSums

# Windows of 10 s, 3 of them: epoch = now // 10, the look-back is the last 30 s.


@pytest.mark.parametrize("adds, now, series", [
    ([], 0, [0.0, 0.0, 0.0]),
    ([(1, 0)], 0, [0.0, 0.0, 1.0]),
    ([(1, 0), (2, 9.999)], 9.999, [0.0, 0.0, 3.0]),
    ([(1, 0), (2, 10)], 10, [0.0, 1.0, 2.0]),
    ([(1, 0), (2, 10), (4, 25)], 25, [1.0, 2.0, 4.0]),
    ([(1, 0), (2, 10), (4, 25)], 30, [2.0, 4.0, 0.0]),
    ([(1, 0), (2, 10), (4, 25)], 49.9, [4.0, 0.0, 0.0]),
    ([(1, 0), (2, 10), (4, 25)], 50, [0.0, 0.0, 0.0]),
    ([(1, 0), (5, 30)], 30, [0.0, 0.0, 5.0]),        # the slot of epoch 0 was reused
    ([(1, 0), (5, 60)], 60, [0.0, 0.0, 5.0]),        # ... even after a long idle spell
    ([(0.5, 5), (0.25, 6)], 15, [0.0, 0.75, 0.0]),
])
def test_series_gives_the_sum_per_window_oldest_first(adds, now, series):
    sums = WindowedSums(10, 3)
    for amount, at in adds:
        sums.add("k", amount, at)
    assert sums.series("k", now) == series


def test_keys_are_summed_apart():
    sums = WindowedSums(10, 3)
    sums.add("a", 1, 0)
    sums.add(("b", 2), 7, 0)
    assert (sums.series("a", 0), sums.series(("b", 2), 0)) == ([0, 0, 1], [0, 0, 7])
    assert sums.series("never", 0) == [0, 0, 0]
    assert sorted(map(str, sums.keys())) == ["('b', 2)", "a"]


@pytest.mark.parametrize("last, total", [(None, 7.0), (1, 4.0), (2, 6.0), (3, 7.0)])
def test_total_sums_the_look_back_or_the_last_windows(last, total):
    sums = WindowedSums(10, 3)
    for amount, at in [(1, 0), (2, 10), (4, 20)]:
        sums.add("k", amount, at)
    assert sums.total("k", 20, last) == total


def test_a_snapshot_holds_keys_with_sums_and_forgets_the_others():
    sums = WindowedSums(10, 3)
    sums.add("old", 1, 0)
    sums.add("new", 2, 20)
    assert sums.snapshot(20) == {"old": [1.0, 0.0, 0.0], "new": [0.0, 0.0, 2.0]}
    assert sums.snapshot(30) == {"new": [0.0, 2.0, 0.0]}
    assert sums.keys() == ["new"]


@pytest.mark.parametrize("now, epoch", [(0, 0), (9.999, 0), (10, 1), (1_700_000_005, 170_000_000)])
def test_epoch_is_the_index_of_the_window_now_falls_in(now, epoch):
    assert WindowedSums(10, 3).epoch(now) == epoch


@pytest.mark.parametrize("window_s, windows", [(0, 3), (-1, 3), (10, 0)])
def test_empty_windows_are_refused(window_s, windows):
    with pytest.raises(ValueError):
        WindowedSums(window_s, windows)
