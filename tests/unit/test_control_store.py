"""The control stores' copies, epochs and failover, over LMDB under tmp_path and peers
faked in memory: a write returns once every in-sync copy applied it, a failover fences
with the next epoch and claims it once, and a copy that is empty or behind never leads."""

import asyncio
import os

import pytest

from rayq.core.control.control_places import (ControlPlace, given_up, promoted, recovered,
                                              seed_target, starting_place, trusted)
from rayq.core.replication.shard_places import best_copies
from rayq.core.control.control_store import ControlReplication, LeaderWatch, fail_over
from rayq.core.replication.shard_places import ShardPlace
from rayq.core.replication.shard_places import trusted_shard
from rayq.core.kit.kv import LmdbKV
from rayq.core.replication.replica import Replica
from rayq.errors import StaleEpoch


class FakeCluster:
    """The GCS's claims and every node's copies, in memory (each copy a real LMDB)."""

    def __init__(self, tmp_path, place: ControlPlace):
        self.tmp_path = tmp_path
        self.claims = {place.epoch: place}
        self.copies: dict[str, Replica] = {}
        self.down: set[str] = set()
        self.started: list[str] = []

    # ControlPeers
    def place(self, store):
        return self.claims[max(self.claims)]

    def claim(self, place):
        if place.epoch in self.claims:
            return False
        self.claims[place.epoch] = place
        return True

    def places(self):
        return {"manager": self.place("manager")}

    def _copy(self, node) -> Replica:
        if node in self.down:
            raise ConnectionError(f"{node} is down")
        if node not in self.copies:
            self.copies[node] = Replica(LmdbKV(self.tmp_path / node))
        return self.copies[node]

    def apply(self, node, store, epoch, seq, sets):
        return self._copy(node).apply(epoch, seq, sets)

    def state(self, node, store):
        copy = self._copy(node)
        return copy.epoch, copy.seq

    def install(self, node, store, data, epoch, seq):
        copy = self._copy(node)
        copy.kv.close()
        folder = self.tmp_path / f"{node}-seeded"
        folder.mkdir(exist_ok=True)
        (folder / "data.mdb").write_bytes(data)
        self.copies[node] = Replica(LmdbKV(folder))
        self.copies[node].install(epoch, seq)

    def start(self, node):
        self.started.append(node)

    @staticmethod
    def snapshot(kv):
        import tempfile
        import os

        with tempfile.TemporaryDirectory() as folder:
            with kv.env.begin() as txn:
                kv.env.copy(folder, compact=True, txn=txn)
            with open(os.path.join(folder, "data.mdb"), "rb") as f:
                return f.read()

    # FailoverPeers
    async def fence(self, node, store, epoch):
        try:
            return self._copy(node).fence(epoch)[1]
        except ConnectionError:
            return None

    async def replace(self, old, new):
        self.started.append(f"{old.store}@{new.leader}")


def leader(tmp_path, cluster, node="n1") -> ControlReplication:
    return ControlReplication("manager", LmdbKV(tmp_path / f"{node}-leader"), node, cluster)


def row(kv, key: bytes):
    return kv.read(lambda txn: txn.get("meta", key))


def test_a_control_write_returns_once_every_in_sync_copy_applied_it(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2", "n3")))
    store = leader(tmp_path, cluster)
    store.transact(lambda txn: txn.put("meta", b"queue", b"orders"))
    for node in ("n2", "n3"):
        assert row(cluster.copies[node].kv, b"queue") == b"orders"
        assert cluster.copies[node].seq == store.seq == 1


def test_a_copy_that_fails_leaves_the_in_sync_set_under_the_next_epoch(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2", "n3")))
    store = leader(tmp_path, cluster)
    store.transact(lambda txn: txn.put("meta", b"a", b"1"))
    cluster.down.add("n3")
    store.transact(lambda txn: txn.put("meta", b"b", b"2"))
    assert cluster.place("manager") == ControlPlace("manager", ("n1", "n2"), 2)
    assert row(cluster.copies["n2"].kv, b"b") == b"2"


def test_a_copy_that_missed_write_sets_is_seeded_with_the_whole_store(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2")))
    store = leader(tmp_path, cluster)
    store.transact(lambda txn: txn.put("meta", b"a", b"1"))
    cluster.copies["n2"].kv.close()
    cluster.copies["n2"] = Replica(LmdbKV(tmp_path / "n2-empty"))  # back with an empty folder
    store.transact(lambda txn: txn.put("meta", b"b", b"2"))
    assert row(cluster.copies["n2"].kv, b"a") == b"1"
    assert row(cluster.copies["n2"].kv, b"b") == b"2"


def test_a_leader_whose_epoch_another_claimed_refuses_every_later_write(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2", "n3")))
    store = leader(tmp_path, cluster)
    store.transact(lambda txn: txn.put("meta", b"a", b"1"))
    asyncio.run(fail_over(cluster.place("manager"), {"n2", "n3"}, cluster, prefer="n2"))
    with pytest.raises(StaleEpoch):
        store.transact(lambda txn: txn.put("meta", b"b", b"2"))
    with pytest.raises(StaleEpoch):
        store.transact(lambda txn: txn.put("meta", b"c", b"3"))
    assert row(cluster.copies["n2"].kv, b"b") is None


def test_a_copy_fenced_by_a_failover_that_claimed_nothing_leaves_and_writes_go_on(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2", "n3")))
    store = leader(tmp_path, cluster)
    store.transact(lambda txn: txn.put("meta", b"a", b"1"))
    cluster.copies["n2"].fence(2)  # a watcher fenced n2, then found no copy to promote
    store.transact(lambda txn: txn.put("meta", b"b", b"2"))
    assert cluster.place("manager") == ControlPlace("manager", ("n1", "n3"), 2)
    assert row(cluster.copies["n3"].kv, b"b") == b"2"
    asyncio.run(fail_over(cluster.place("manager"), {"n3"}, cluster))  # a failover that claims
    with pytest.raises(StaleEpoch):
        store.transact(lambda txn: txn.put("meta", b"c", b"3"))


def test_failover_fences_the_copies_with_the_next_epoch_and_claims_it_once(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2", "n3"), 4))
    store = leader(tmp_path, cluster)
    store.transact(lambda txn: txn.put("meta", b"a", b"1"))
    first = asyncio.run(fail_over(cluster.place("manager"), {"n2", "n3"}, cluster, "n3"))
    second = asyncio.run(fail_over(ControlPlace("manager", ("n1", "n2", "n3"), 4),
                                   {"n2", "n3"}, cluster, "n2"))
    assert first == ControlPlace("manager", ("n3", "n2"), 5)
    assert second is None  # epoch 5 was claimed: one winner
    assert {cluster.copies[n].epoch for n in ("n2", "n3")} == {5}  # the old leader is fenced
    assert cluster.started == ["manager@n3"]


def test_failover_waits_when_no_in_sync_copy_is_reachable(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1", "n2")))
    cluster.down.add("n2")
    assert asyncio.run(fail_over(cluster.place("manager"), {"n2"}, cluster)) is None
    assert cluster.started == []


@pytest.mark.parametrize("applied, prefer, chosen", [
    ({"n2": 7, "n3": 9}, "n2", ("n3",)),          # the copy that applied most leads
    ({"n2": 9, "n3": 9}, "n3", ("n3", "n2")),     # among equals the watcher's own
    ({"n2": 9, "n4": 99}, "n4", ("n2",)),         # a copy out of sync never leads
])
def test_the_copy_that_applied_most_leads_after_a_failover(applied, prefer, chosen):
    place = promoted(ControlPlace("manager", ("n1", "n2", "n3"), 2), applied, prefer)
    assert place.in_sync == chosen and place.epoch == 3


def test_a_copy_that_applied_nothing_is_never_promoted_however_alone_it_is(tmp_path):
    # n2 came back with an empty folder before its leader noticed; n3 holds every write
    # but does not answer: the store waits rather than lead from the empty copy
    place = ControlPlace("manager", ("n1", "n2", "n3"), 4)
    assert promoted(place, {"n2": 0}, prefer="n2") is None
    assert promoted(place, {"n2": 0, "n3": 5}, prefer="n2") == ControlPlace("manager", ("n3",), 5)
    cluster = FakeCluster(tmp_path, place)
    cluster.down.add("n3")
    assert asyncio.run(fail_over(place, {"n2", "n3"}, cluster, prefer="n2")) is None
    assert cluster.started == []


def test_a_leader_writes_a_first_write_set_before_it_seeds_a_first_copy(tmp_path):
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1",)))
    store = leader(tmp_path, cluster)
    store.keep(["n1", "n2"], 2)
    assert cluster.place("manager") == ControlPlace("manager", ("n1", "n2"), 2)
    assert store.seq == cluster.copies["n2"].seq == 1  # so a copy at 0 never was in sync


def test_a_seeding_that_failed_on_a_node_is_tried_next_on_another(tmp_path):
    # n2 is alive in Ray's node list but its copy cannot be reached: the store gets its
    # second copy on n3 instead of asking n2 again every round
    cluster = FakeCluster(tmp_path, ControlPlace("manager", ("n1",)))
    store = leader(tmp_path, cluster)
    cluster.down.add("n2")
    store.keep(["n1", "n2", "n3"], 2)
    assert cluster.place("manager").in_sync == ("n1",)
    store.keep(["n1", "n2", "n3"], 2)
    assert cluster.place("manager").in_sync == ("n1", "n3")
    place = ControlPlace("manager", ("n1",))
    assert seed_target(place, ["n1", "n2", "n3"], 2, {"n3": 2}) == "n2"
    assert seed_target(place, ["n1", "n2", "n3"], 2, {"n3": 2}, failed={"n2": 1}) == "n3"


def test_a_leader_is_lost_when_its_node_goes_or_after_three_missed_pings_past_its_grace():
    watch = LeaderWatch("n2", max_failed_pings=3, start_grace_s=60.0, started=0.0)
    place = ControlPlace("manager", ("n1", "n2"), 3)
    assert [watch.lost(place, True, False, now) for now in (1, 2, 3)] == [False] * 3  # grace
    assert watch.missing() is False
    assert [watch.lost(place, True, True, now) for now in (4, 5)] == [False, False]
    assert watch.lost(place, True, False, 6) is False and watch.missing()
    assert [watch.lost(place, True, False, now) for now in (7, 8)] == [False, True]
    assert watch.lost(ControlPlace("manager", ("n3", "n2"), 4), False, False, 9)  # node gone
    assert not watch.watches(ControlPlace("manager", ("n1", "n3"), 5))


def test_a_copy_seeded_long_after_the_watch_started_gives_its_running_leader_no_grace():
    watch = LeaderWatch("n2", max_failed_pings=3, start_grace_s=60.0, started=0.0)
    place = ControlPlace("flood", ("n1", "n2"), 2)  # n2's copy joined at 100 s
    assert [watch.lost(place, True, False, now) for now in (100, 101, 102)] == [False, False, True]
    moved = ControlPlace("flood", ("n3", "n2"), 3)  # a new leader placed: its grace
    assert [watch.lost(moved, True, False, now) for now in (103, 104, 105)] == [False] * 3


def test_an_empty_folder_under_a_known_name_never_leads_a_restarted_runtime():
    place = ShardPlace(0, ("n1", "n2"), ("n1", "n2"), 2)  # n1 came back empty
    fixed = trusted_shard(place, {"n1": (0, 0), "n2": (2, 20)})
    assert fixed == ShardPlace(0, ("n2", "n1"), ("n2",), 3)
    assert trusted_shard(place, {"n1": (2, 20), "n2": (2, 20)}) == place
    assert trusted_shard(place, {"n1": None, "n2": (2, 20)}).leader == "n2"
    control = ControlPlace("manager", ("n1", "n2"), 5)
    assert trusted(control, {"n2": (5, 12)}) == ControlPlace("manager", ("n2",), 6)


def test_a_control_store_rebuilt_from_disks_is_led_by_the_fullest_copy():
    held = {"n1": (0, 0), "n2": (4, 30), "n3": (4, 30), "n4": (3, 10)}
    assert recovered("manager", held, ["n1", "n2", "n3", "n4"]) == \
        ControlPlace("manager", ("n2", "n3"), 5)
    assert recovered("manager", {"n1": (0, 0)}, ["n1"]) is None
    assert starting_place("manager", None, {}, ["n2", "n1"]) == ControlPlace("manager", ("n1",))
    assert best_copies(("n1", "n2"), {}) == ("n1", "n2")  # nothing on disk: as placed


def test_shards_rebuilt_from_disks_are_led_by_the_fullest_copy_under_a_higher_epoch():
    from rayq.core.replication.shard_places import recovered_shards

    held = {"n1": {"shard-0": (3, 40), "shard-1": (2, 9)},
            "n2": {"shard-0": (3, 40), "shard-1": (3, 12), "manager": (5, 7)},
            "n3": {"shard-0": (2, 44), "shard-1": (0, 0)}}
    places = recovered_shards(held, shards=3)
    # an older epoch's longer history (a replaced leader's unacknowledged writes) loses
    assert places[0] == ShardPlace(0, ("n1", "n2", "n3"), ("n1", "n2"), 4)
    assert places[1] == ShardPlace(1, ("n2", "n1"), ("n2",), 4)
    assert 2 not in places  # no copy anywhere: placed as a new shard


def test_a_seed_moves_a_copy_that_applied_more_aside_and_never_deletes_it(tmp_path):
    from rayq.core.replication.replica import clear_for_seed, open_copy

    fuller = open_copy(str(tmp_path / "shard-0"), 1 << 20)
    fuller.apply(3, 1, [(("meta", b"acked", b"yes"),)] * 9)  # nine write sets applied
    fuller.kv.close()
    clear_for_seed(str(tmp_path / "shard-0"), seq=4)  # a seed holding fewer
    kept = open_copy(str(tmp_path / "shard-0.kept-3-9"), 1 << 20)
    assert (kept.epoch, kept.seq) == (3, 9) and row(kept.kv, b"acked") == b"yes"
    assert os.listdir(tmp_path / "shard-0") == []  # emptied for the seed
    clear_for_seed(str(tmp_path / "shard-0"), seq=4)  # an empty one: nothing to keep
    assert sorted(os.listdir(tmp_path)) == ["shard-0", "shard-0.kept-3-9"]


def test_the_node_a_failover_gave_up_on_is_the_old_leader_out_of_the_copies():
    before = ControlPlace("manager", ("n1", "n2", "n3"), 4)
    assert given_up(before, ControlPlace("manager", ("n2", "n3"), 5)) == "n1"
    assert given_up(before, ControlPlace("manager", ("n2", "n1"), 5)) is None  # handed over
    assert given_up(None, before) is None and given_up(before, None) is None
