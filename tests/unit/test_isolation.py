"""Where the flood detector moves a flooder's messages (rayq.core.flood.isolation)."""

from rayq.core.flood.detection import ALL_TENANTS, FloodChanges, Flooder
import pytest

from rayq.core.flood.isolation import (dedicated_by_shard, dedicated_on, dedicated_to, diverts,
                                 fully_swept, isolation_moves, serving_order,
                                 left_to_sweep, listed, shards_lacking_dedicated, spilled_on,
                                 subqueue_layout, with_sweeps)
from rayq.core.codec.model import SubqueueState
from tests.unit.layouts import queue_info

ACME = Flooder("q", "report", "acme", since=0.0)
TYPE = Flooder("q", "report", ALL_TENANTS, since=0.0)
# live 1 (shard 0), 2 (shard 1), 3 (shard 2); acme's dedicated 10 (shard 0, open) and
# 11 (shard 1, coalescing); bob's dedicated 12 (shard 0)
QUEUE = queue_info("q", {1: 0, 2: 1, 3: 2, 10: 0, 11: 1, 12: 0},
                   dedicated={10: ("report", "acme"), 11: ("report", "acme"),
                              12: ("report", "bob")},
                   states={11: SubqueueState.NO_PUT})


def test_the_layout_marks_dedicated_subqueues():
    layout = subqueue_layout({"q": QUEUE})
    assert layout[1] == ("q", False) and layout[10] == ("q", True) and len(layout) == 6


def test_a_flooders_dedicated_subqueues_open_or_all_and_none_of_a_deleted_queue():
    assert [sq.id for sq in dedicated_to(QUEUE, ACME)] == [10]
    assert [sq.id for sq in dedicated_to(QUEUE, ACME, open_only=False)] == [10, 11]
    assert dedicated_to(None, ACME) == []
    assert dedicated_by_shard(QUEUE, ACME) == {0: 10}


def test_shards_with_live_subqueues_but_no_open_dedicated_one_lack_one():
    assert shards_lacking_dedicated(QUEUE, dedicated_by_shard(QUEUE, ACME)) == [1, 2]
    assert shards_lacking_dedicated(QUEUE, {0: 10, 1: 20, 2: 30}) == []


def test_isolation_moves_each_live_subqueue_into_its_dedicated_twin_on_its_shard():
    assert isolation_moves(QUEUE, {0: 10, 2: 30}) == [(0, 1, 10), (2, 3, 30)]


def test_each_shard_diverts_the_flooders_puts_to_its_live_subqueues():
    other = queue_info("r", {5: 1})
    bob = Flooder("r", "mail", "bob", since=0.0)
    assert diverts({"q": QUEUE, "r": other}, [ACME, bob], shards=3) == [
        {1: [("report", "acme")]},
        {2: [("report", "acme")], 5: [("mail", "bob")]},
        {3: [("report", "acme")]}]


def test_the_list_keeps_flooders_of_existing_queues_then_adds_the_new_ones():
    gone = Flooder("deleted", "report", "acme", since=0.0)
    changes = FloodChanges(added=(TYPE,), removed=(), kept=(ACME, gone))
    assert listed(changes, {"q": QUEUE}) == [ACME, TYPE]


def test_spilled_counts_only_spill_entries_the_flooder_covers():
    counts = {("S", 1, "report", "acme"): 5, ("S", 2, "report", "bob"): 7,
              ("L", 1, "report", "acme"): 100, ("S", 1, "mail", "acme"): 3}
    assert spilled_on(counts, ACME) == 5
    assert spilled_on(counts, TYPE) == 12


def test_a_batch_that_moved_nothing_ends_the_sweep_and_the_list_records_who_was_swept_empty():
    assert left_to_sweep(250, 100) == 150
    assert left_to_sweep(250, 0) == 0          # the rest had expired
    swept = with_sweeps([ACME, TYPE], {ACME.combination})
    assert [f.swept_empty for f in swept] == [True, False]


def test_a_flooder_is_fully_swept_when_every_dedicated_subqueue_took_back_all_its_spill():
    done = {("q", "a", "x"): [True, True], ("q", "b", "x"): [True, False],
            ("q", "c", "x"): []}              # no open dedicated subqueue: nothing swept
    assert fully_swept(done) == {("q", "a", "x")}


@pytest.mark.parametrize("turn, every, expected", [
    (0, 2, [1, 2, 10]),   # off turn: receive order, the dedicated subqueue last
    (1, 2, [10, 1, 2]),   # every second receive serves it first
    (2, 2, [1, 2, 10]),
    (3, 2, [10, 1, 2]),
    (4, 5, [10, 1, 2]),   # every fifth: turns 4, 9, ...
    (5, 5, [1, 2, 10]),
    (0, 1, [10, 1, 2]),   # every receive
    (1, 0, [1, 2, 10]),   # never: the dedicated subqueue waits behind the others
])
def test_a_dedicated_subqueue_is_served_first_on_its_turns(turn, every, expected):
    assert serving_order([1, 2, 10], {10}, turn, every) == expected


def test_over_many_turns_a_dedicated_subqueue_leads_one_receive_in_every():
    firsts = [serving_order([1, 10], {10}, turn, 4)[0] for turn in range(100)]
    assert firsts.count(10) == 25 and firsts.count(1) == 75


def test_each_shard_knows_the_dedicated_subqueues_it_holds():
    assert dedicated_on({"q": QUEUE}, 3) == [[10, 12], [11], []]
