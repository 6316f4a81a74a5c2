"""Clearing a queue swaps in fresh subqueues and records the old ones for removal."""

from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.model import SubqueueState
from rayq.core.control.registry import QueueRegistry
from rayq.testing import FakeClock


def registry(path):
    return QueueRegistry(LmdbKV(path), shards=2, clock=FakeClock())


def test_renew_swaps_in_fresh_subqueues_on_the_same_shards_and_records_the_old(tmp_path):
    reg = registry(tmp_path)
    queue = reg.create("jobs", subqueues=2, max_receives=5, shard_depths={})
    dedicated = reg.add_dedicated("jobs", 1, "report", "acme")
    draining = reg.add_subqueue("jobs", 0)
    reg.set_state("jobs", draining.id, SubqueueState.NO_PUT)
    old = reg.renew("jobs")
    fresh = reg.get("jobs").subqueues
    assert {s.id for s in old} == {s.id for s in queue.subqueues} | {dedicated.id, draining.id}
    assert not {s.id for s in fresh} & {s.id for s in old}
    assert sorted((s.shard, str(s.dedicated)) for s in fresh) == sorted(
        [(s.shard, "None") for s in queue.subqueues] + [(1, str(("report", "acme")))])
    assert all(s.state is SubqueueState.ALL for s in fresh)
    assert reg.get("jobs").dead_letter == queue.dead_letter  # the DLQ is not cleared
    reg.kv.close()
    reg = registry(tmp_path)  # persisted with the swap
    pending = reg.pending_purges()
    assert sorted((s.id, s.shard) for s in pending) == sorted((s.id, s.shard) for s in old)
    reg.purged([s.id for s in old])
    assert reg.pending_purges() == []
