"""A leader's linger and hand-over (rayq.core.kit.batcher.Batcher.linger, pass_lead) as
tables: how long and for how many callers a leader waits, and who leads next."""

import pytest

from rayq.core.kit.batcher import Batcher


def after_flush(answered: int, flush_s: float, pending: int) -> Batcher:
    """A batcher whose last flush answered ``answered`` callers in ``flush_s`` seconds,
    with ``pending`` calls waiting since."""
    batcher = Batcher()
    for n in range(answered):
        batcher.add(n, f"w{n}")
    batcher.flushed(batcher.take(), flush_s)
    for n in range(pending):
        batcher.add(answered + n, f"p{n}")
    return batcher


@pytest.mark.parametrize("answered, flush_s, pending, max_s, linger", [
    (8, 0.010, 1, 0.001, (8, 0.001)),     # half the flush is 5 ms: capped at max_s
    (8, 0.010, 7, 0.001, (8, 0.001)),
    (8, 0.001, 1, 0.010, (8, 0.0005)),    # under the cap: half the last flush
    (4, 2.0, 3, 0.001, (4, 0.001)),       # a slow flush never makes the leader wait long
    (4, 0.010, 4, 0.001, None),           # as many pending as answered: take now
    (4, 0.010, 6, 0.001, None),
    (4, 0.010, 0, 0.001, None),           # nobody pending: nothing to wait for
    (1, 0.010, 1, 0.001, None),           # a caller alone never waits
])
def test_a_leader_lingers_for_the_last_flushs_callers_at_most_max_s(
        answered, flush_s, pending, max_s, linger):
    assert after_flush(answered, flush_s, pending).linger(max_s) == linger


def test_a_batcher_that_never_flushed_does_not_linger():
    batcher = Batcher()
    batcher.add(1, "w1")
    assert batcher.linger(0.001) is None


@pytest.mark.parametrize("pending, next_leader, in_flight", [
    (0, None, 0),        # nothing pending: the lead ends
    (1, "p0", 1),        # the oldest pending caller leads next; the lead stays taken
    (3, "p0", 1),
])
def test_after_a_flush_the_lead_passes_to_the_oldest_pending_caller(pending, next_leader,
                                                                   in_flight):
    batcher = after_flush(2, 0.001, pending)
    assert batcher.pass_lead() == next_leader
    assert batcher.in_flight == in_flight
    assert len(batcher) == pending        # passing the lead takes nothing
