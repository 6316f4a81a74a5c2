"""The leader's shipping of write sets, against followers and a manager faked in
memory: acknowledgements wait for every in-sync follower, a lost follower is taken
out of the in-sync set, a newer epoch refuses the old leader."""

import asyncio

import pytest

from rayq.core.replication.shard_places import ShardPlace
from rayq.core.replication.shard_places import rejoin, shrink
from rayq.core.replication.shipping import Shipper, acknowledged
from rayq.core.kit.kv import LmdbKV, Write
from rayq.core.replication.replica import Replica
from rayq.errors import NotEnoughReplicas, RuntimeFailure, StaleEpoch


class FakePeers:
    """Followers as Replicas over LMDB under tmp_path; the manager as a dict of places."""

    def __init__(self, tmp_path, place: ShardPlace):
        self.replicas = {n: Replica(LmdbKV(tmp_path / n)) for n in place.followers}
        self.place, self.down, self.gate = place, set(), {}
        self.offered: dict[str, list[tuple[int, int]]] = {}  # (first_seq, sets) per call
        self.held_at_rejoin: dict[str, int] = {}  # what a follower applied when it rejoined

    async def state(self, node):
        return self.replicas[node].epoch, self.replicas[node].seq

    async def apply(self, node, epoch, first_seq, sets):
        if node in self.down:
            raise ConnectionError(f"{node} is gone")
        self.offered.setdefault(node, []).append((first_seq, len(sets)))
        if node in self.gate:
            await self.gate[node].wait()
        return self.replicas[node].apply(epoch, first_seq, sets)

    async def shrink(self, node, epoch):
        self.place = shrink(self.place, node, epoch)
        return self.place

    async def rejoin(self, node, epoch):
        self.held_at_rejoin[node] = self.replicas[node].seq
        self.place = rejoin(self.place, node)
        return self.place


def group(shipper, n):
    """One group commit's results, shipped: its write set puts row k<n>."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    done.set_result(shipper.ship([n], (Write("rows", b"k%d" % n, b"v"),))[0])
    return acknowledged(done)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_write_is_acknowledged_once_every_in_sync_follower_applied_it(tmp_path):
    place = ShardPlace(0, ("a", "b", "c"), ("a", "b", "c"), 1)
    peers = FakePeers(tmp_path, place)

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)
        peers.gate["c"] = asyncio.Event()
        first = asyncio.ensure_future(group(shipper, 1))
        await asyncio.sleep(0.05)
        assert not first.done()                 # b applied it, c not yet
        peers.gate["c"].set()
        assert await first == 1
        assert await asyncio.gather(group(shipper, 2), group(shipper, 3)) == [2, 3]
        return shipper
    run(scenario())
    for replica in peers.replicas.values():
        assert replica.seq == 3
        assert replica.kv.read(lambda txn: txn.get("rows", b"k3")) == b"v"


def test_a_lost_follower_leaves_the_in_sync_set_and_the_leader_goes_on(tmp_path):
    place = ShardPlace(0, ("a", "b", "c"), ("a", "b", "c"), 1)
    peers = FakePeers(tmp_path, place)
    peers.down.add("c")

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)
        assert await group(shipper, 1) == 1
        return shipper
    shipper = run(scenario())
    assert peers.place.in_sync == ("a", "b") and peers.place.epoch == 2
    assert shipper.place == peers.place
    assert peers.replicas["b"].epoch == 1     # learns epoch 2 with the next write set


def test_fewer_in_sync_copies_than_min_in_sync_refuse_the_acknowledgement(tmp_path):
    place = ShardPlace(0, ("a", "b"), ("a", "b"), 1)
    peers = FakePeers(tmp_path, place)
    peers.down.add("b")

    async def scenario():
        shipper = Shipper(0, place, 0, 2, peers)
        assert isinstance(await group(shipper, 1), NotEnoughReplicas)
        with pytest.raises(NotEnoughReplicas):
            shipper.check()
    run(scenario())


def test_a_leader_replaced_by_a_newer_epoch_acknowledges_nothing(tmp_path):
    place = ShardPlace(0, ("a", "b"), ("a", "b"), 1)
    peers = FakePeers(tmp_path, place)
    peers.replicas["b"].fence(2)   # the manager promoted another leader meanwhile

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)
        assert isinstance(await group(shipper, 1), StaleEpoch)
        with pytest.raises(StaleEpoch):
            shipper.check()
    run(scenario())
    assert peers.replicas["b"].seq == 0


def test_a_follower_that_applied_other_write_sets_is_out_of_sync(tmp_path):
    place = ShardPlace(0, ("a", "b"), ("a", "b"), 1)
    peers = FakePeers(tmp_path, place)
    peers.replicas["b"].apply(1, 1, [(Write("rows", b"x", b"y"),)])

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)
        assert await group(shipper, 1) == 1
    run(scenario())
    assert peers.place.in_sync == ("a",)


def test_a_seeded_follower_joins_while_writes_never_stop_and_only_holding_every_ack(tmp_path):
    """A write lands during every apply call to the new follower c, so c is never
    exactly caught up; it still joins, and only once it holds every write set already
    acknowledged (failover may promote it from then on)."""
    place = ShardPlace(0, ("a", "b"), ("a", "b"), 1)
    peers = FakePeers(tmp_path, place)
    peers.replicas["c"] = Replica(LmdbKV(tmp_path / "c"))
    shipped: list = []  # (n, its Shipped) of every group commit
    held_at_join: list = []

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)

        def commit():
            n = len(shipped) + 1
            shipped.append((n, shipper.ship([n], (Write("rows", b"k%d" % n, b"v"),))[0]))

        apply = peers.apply

        async def apply_while_writing(node, epoch, first_seq, sets):
            if node == "c" and "c" not in peers.place.in_sync:
                commit()
            await asyncio.sleep(0)
            return await apply(node, epoch, first_seq, sets)

        async def rejoin_checked(node, epoch):
            acked = [n for n, one in shipped if one.acked.done()]
            held_at_join.append((peers.replicas["c"].seq, max(acked)))
            return await FakePeers.rejoin(peers, node, epoch)

        peers.apply, peers.rejoin = apply_while_writing, rejoin_checked
        for _ in range(3):
            commit()
        await asyncio.sleep(0.05)

        async def install(seq):
            peers.replicas["c"].apply(1, 1, [(Write("rows", b"k%d" % n, b"v"),)
                                            for n in range(1, seq + 1)])

        async def copy():
            return shipper.log.committed

        seeding = asyncio.ensure_future(shipper.seed("c", copy, install))
        await asyncio.sleep(0.05)
        commit()  # the first write after the copy: from here on one lands in each call
        assert await seeding == 3            # once c is in sync
        assert "c" in peers.place.in_sync
        commit()
        last = shipped[-1][1]
        await last.acked
        assert peers.replicas["c"].seq >= shipped[-1][0]  # acknowledged: c applied it too
        shipper.stop()
    run(scenario())
    (held, acked), = held_at_join
    assert held >= acked
    assert peers.place.in_sync == ("a", "b", "c")


def test_a_seeding_fails_when_its_follower_is_lost_before_it_is_in_sync(tmp_path):
    place = ShardPlace(0, ("a", "b"), ("a", "b"), 1)
    peers = FakePeers(tmp_path, place)
    peers.replicas["c"] = Replica(LmdbKV(tmp_path / "c"))

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)
        await group(shipper, 1)

        async def copy():
            return 0

        async def install(seq):
            peers.down.add("c")   # the new follower dies right after its copy

        seeding = asyncio.ensure_future(shipper.seed("c", copy, install))
        await asyncio.sleep(0.05)
        assert await group(shipper, 2) == 2  # the leader goes on without it
        with pytest.raises(RuntimeFailure):
            await seeding
    run(scenario())
    assert peers.place.in_sync == ("a", "b")


def test_a_seeded_follower_counted_one_call_behind_rejoins_only_holding_every_earlier_ack(
        tmp_path):
    """The new follower c is counted (acknowledgements wait for it) while a call of
    one write set is in flight and two more were acknowledged without it: it is put in
    sync, and so made promotable, only once it applied those two as well."""
    place = ShardPlace(0, ("a", "b"), ("a", "b"), 1)
    peers = FakePeers(tmp_path, place)
    peers.replicas["c"] = Replica(LmdbKV(tmp_path / "c"))

    async def scenario():
        shipper = Shipper(0, place, 0, 1, peers)
        for n in (1, 2, 3):
            assert await group(shipper, n) == n

        async def copy():
            return shipper.log.committed

        installed = asyncio.Event()

        async def install(seq):
            peers.replicas["c"].apply(1, 1, [(Write("rows", b"k%d" % n, b"v"),)
                                            for n in range(1, seq + 1)])
            installed.set()

        peers.gate["c"] = asyncio.Event()
        seeding = asyncio.ensure_future(shipper.seed("c", copy, install))
        await installed.wait()
        assert await group(shipper, 4) == 4
        while "c" not in peers.offered:
            await asyncio.sleep(0)
        assert peers.offered["c"] == [(4, 1)]   # c's first call is held
        assert await asyncio.gather(group(shipper, 5), group(shipper, 6)) == [5, 6]
        assert "c" not in peers.place.in_sync   # 5 and 6 acknowledged without c
        peers.gate["c"].set()
        assert await seeding == 3
        shipper.stop()
    run(scenario())
    assert peers.held_at_rejoin == {"c": 6}
    assert peers.place.in_sync == ("a", "b", "c")
