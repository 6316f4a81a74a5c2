"""The queue registry: one namespace per account, and data directories written before
namespaces opening with their queues where their accounts can still reach them."""

import pytest

from rayq.core.kit.clock import FakeClock
from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.model import pack
from rayq.core.control.registry import QueueRegistry, check_queue_ref
from rayq.errors import InvalidMessage, QueueNotFound


def open_registry(kv) -> QueueRegistry:
    return QueueRegistry(kv, shards=2, clock=FakeClock(1000.0))


def old_record(name: str, ids: list[int], dlq: list[int], owner: str | None = None,
               is_dlq: bool = False) -> bytes:
    """A queue record as the one-namespace registry wrote it under ``q:<name>``; records
    written before accounts existed have no ``owner``."""
    record = {"name": name, "min": 1, "max_receives": None if is_dlq else 3,
              "dlq": [[0, d] for d in dlq], "created_at": 5.0, "is_dlq": is_dlq,
              "subqueues": [[i, 0, "all", v, None] for v, i in enumerate(ids)]}
    if owner is not None:
        record["owner"] = owner
    return pack(record)


def write_old_registry(path) -> None:
    kv = LmdbKV(path)

    def write(txn):
        txn.put("meta", b"q:orders", old_record("orders", [1], [2]))
        txn.put("meta", b"q:orders-dlq", old_record("orders-dlq", [2], [], is_dlq=True))
        txn.put("meta", b"q:acme-jobs", old_record("acme-jobs", [3], [4], owner="acme"))
        txn.put("meta", b"q:acme-jobs-dlq",
                old_record("acme-jobs-dlq", [4], [], owner="acme", is_dlq=True))
        txn.put("meta", b"next_sq", b"5")
    kv.transact(write)
    kv.close()


def test_an_old_registry_opens_with_its_queues_in_the_default_account(tmp_path):
    write_old_registry(tmp_path / "manager")
    registry = open_registry(LmdbKV(tmp_path / "manager"))
    orders = registry.get("orders")
    assert orders.owner == "default" and orders.ref == "orders"
    assert [s.id for s in orders.subqueues] == [1] and orders.dead_letter == ((0, 2),)
    assert registry.get("orders-dlq").owner == "default"
    # usable: it grows, and new subqueue ids do not collide with the old ones
    added = registry.add_subqueue("orders", 1)
    assert added.id == 5 and registry.get("orders-dlq").dead_letter == ()
    assert {s.shard for s in registry.get("orders-dlq").subqueues} == {0, 1}


def test_an_accounts_queue_in_an_old_registry_stays_that_accounts(tmp_path):
    write_old_registry(tmp_path / "manager")
    open_registry(LmdbKV(tmp_path / "manager")).kv.close()  # migrates, then reopened
    kv = LmdbKV(tmp_path / "manager")
    registry = open_registry(kv)
    assert registry.names() == ["acme/acme-jobs", "acme/acme-jobs-dlq", "orders", "orders-dlq"]
    assert registry.get("acme/acme-jobs").owner == "acme"
    with pytest.raises(QueueNotFound):
        registry.get("acme-jobs")
    keys = kv.read(lambda txn: [k for k, _ in txn.scan("meta", b"q:", b"q;")])
    assert keys == [b"q:acme/acme-jobs", b"q:acme/acme-jobs-dlq", b"q:orders", b"q:orders-dlq"]
    assert registry.delete("acme/acme-jobs") and registry.names() == ["orders", "orders-dlq"]


def test_two_accounts_each_have_their_own_queue_of_one_name(tmp_path):
    registry = open_registry(LmdbKV(tmp_path / "m"))
    a = registry.create("orders", subqueues=1, max_receives=3, shard_depths={}, owner="acme")
    b = registry.create("orders", subqueues=2, max_receives=5, shard_depths={}, owner="globex")
    mine = registry.create("orders", subqueues=1, max_receives=None, shard_depths={})
    assert (a.ref, b.ref, mine.ref) == ("acme/orders", "globex/orders", "orders")
    ids = [s.id for q in (a, b, mine) for s in q.subqueues]
    assert len(ids) == len(set(ids)) == 4  # subqueue ids stay global
    assert registry.get("globex/orders-dlq").owner == "globex"  # DLQs follow their account
    registry_dlq = registry.get("acme/orders-dlq")
    assert {d for _, d in a.dead_letter} == {s.id for s in registry_dlq.subqueues}
    removed = registry.delete("acme/orders")
    assert registry.names() == ["globex/orders", "globex/orders-dlq", "orders", "orders-dlq"]
    # the deleted queue's subqueues (its DLQ's too) are recorded for purging with it
    assert sorted(s.id for s in removed) == sorted(
        s.id for q in (a, registry_dlq) for s in q.subqueues)
    assert sorted(s.id for s in open_registry(registry.kv).pending_purges()) == sorted(
        s.id for s in removed)
    reopened = open_registry(registry.kv)
    assert reopened.get("globex/orders").max_receives == 5


@pytest.mark.parametrize("name, ok", [
    ("orders", True), ("acme/orders", True), ("acme/orders/x", False), ("/orders", False),
    ("acme/", False), ("ac me/orders", False), ("a" * 81, False),
])
def test_queue_names_are_plain_or_account_qualified(name, ok):
    if ok:
        assert check_queue_ref(name) == name
    else:
        with pytest.raises(InvalidMessage):
            check_queue_ref(name)


def test_an_ordered_queue_has_one_subqueue_and_is_remembered_as_ordered(tmp_path):
    from rayq.errors import QueueExists

    reg = QueueRegistry(LmdbKV(tmp_path), shards=2, clock=FakeClock(1000.0))
    with pytest.raises(InvalidMessage):
        reg.create("jobs.fifo", subqueues=2, max_receives=None, shard_depths={}, ordered=True)
    queue = reg.create("jobs.fifo", subqueues=1, max_receives=None, shard_depths={}, ordered=True)
    assert queue.ordered and not reg.get("jobs.fifo-dlq").ordered
    assert reg.create("jobs.fifo", subqueues=1, max_receives=None, shard_depths={},
                      ordered=True) == queue
    with pytest.raises(QueueExists):
        reg.create("jobs.fifo", subqueues=1, max_receives=None, shard_depths={})
    assert not reg.create("plain", subqueues=1, max_receives=None, shard_depths={}).ordered
    reg.kv.close()
    reg = QueueRegistry(LmdbKV(tmp_path), shards=2, clock=FakeClock(1000.0))
    assert reg.get("jobs.fifo").ordered and not reg.get("plain").ordered
    assert reg.renew("jobs.fifo") and reg.get("jobs.fifo").ordered


def test_an_ordered_queue_neither_scales_nor_is_watched_for_flooders(tmp_path):
    from rayq.core.control.registry import flood_watched

    reg = QueueRegistry(LmdbKV(tmp_path), shards=2, clock=FakeClock(1000.0))
    ordered = reg.create("g.fifo", subqueues=1, max_receives=None, shard_depths={}, ordered=True)
    plain = reg.create("plain", subqueues=1, max_receives=None, shard_depths={})
    assert (ordered.scales, ordered.shards_told, ordered.ordered_subqueues) == (
        False, True, ordered.subqueues)
    assert (plain.scales, plain.shards_told, plain.ordered_subqueues) == (True, False, ())
    assert list(flood_watched(reg.all())) == ["plain"]
