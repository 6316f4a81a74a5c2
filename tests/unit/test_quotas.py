"""Per-account quotas: the values the admin may set, the manager's decisions (queues,
each account's room) and a shard gate's approximate check of puts."""

import asyncio
import time

import pytest

from rayq.core.auth.accounts import Accounts, Place, Signer, new_secret
from rayq.core.auth.gate import Gate
from rayq.core.auth.operations import SHARD_OPS
from rayq.core.auth.quotas import (DEFAULT_QUOTA, NO_QUOTA, PutTally, Quota, Quotas, Room, check_queue_quota,
                                   over_quota, quota_of)
from rayq.core.codec.model import SubqueueState
from rayq.core.codec.wire import Attrs, encode_put, put_count
from rayq.core.control.managing import owned_queues, rooms_of
from rayq.core.control.registry import QueueInfo, SubqueueInfo
from rayq.core.kit.kv import LmdbKV
from rayq.errors import InvalidMessage, QuotaExceeded
from rayq.testing import FakeClock

NOW = 1_000_000.0


@pytest.mark.parametrize("asked, quota", [
    ({}, NO_QUOTA),
    ({"queues": 3}, Quota(queues=3)),
    ({"queues": 0, "messages": 10, "bytes": 1 << 20}, Quota(0, 10, 1 << 20)),
])
def test_a_quota_is_made_of_integers_or_none(asked, quota):
    assert quota_of(**asked) == quota


@pytest.mark.parametrize("asked", [{"queues": -1}, {"messages": 1.5}, {"bytes": "10"},
                                   {"queues": True}])
def test_a_quota_refuses_anything_but_integers_from_zero(asked):
    with pytest.raises(InvalidMessage):
        quota_of(**asked)


@pytest.mark.parametrize("quota, owned, refused", [
    (NO_QUOTA, 10_000, False),
    (Quota(queues=2), 1, False),
    (Quota(queues=2), 2, True),
    (Quota(queues=0), 0, True),
    (Quota(messages=1), 50, False),  # a message quota does not limit queues
])
def test_a_queue_past_the_queue_quota_is_refused(quota, owned, refused):
    if refused:
        with pytest.raises(QuotaExceeded, match="acme"):
            check_queue_quota("acme", quota, owned)
    else:
        check_queue_quota("acme", quota, owned)


@pytest.mark.parametrize("quota, messages, size_bytes, passed", [
    (NO_QUOTA, 10**9, 10**12, None),
    (Quota(messages=10), 10, 0, None),
    (Quota(messages=10), 11, 0, "10 messages"),
    (Quota(bytes=100), 1, 100, None),
    (Quota(bytes=100), 1, 101, "100 bytes"),
    (Quota(messages=10, bytes=100), 11, 101, "10 messages"),
])
def test_over_quota_names_the_limit_a_put_would_pass(quota, messages, size_bytes, passed):
    assert over_quota(quota, messages, size_bytes) == passed


def test_a_tally_adds_the_puts_it_admitted_after_the_managers_count_to_it():
    tally, room = PutTally(), Room("acme", Quota(messages=10), stored_messages=7, counted_at=NOW)
    tally.admit(room, 2, 20, NOW + 1)
    tally.admit(room, 1, 10, NOW + 2)  # 7 counted + 3 admitted after = 10
    with pytest.raises(QuotaExceeded, match="10 messages"):
        tally.admit(room, 1, 10, NOW + 3)
    # a count made after the first put holds it: only the later one is added (9 + 1)
    tally.admit(Room("acme", Quota(messages=10), 9, counted_at=NOW + 1.5), 0, 0, NOW + 4)
    with pytest.raises(QuotaExceeded):
        tally.admit(Room("acme", Quota(messages=10), 9, counted_at=NOW + 1.5), 1, 10, NOW + 4)
    tally.admit(Room("acme", Quota(messages=10), 9, counted_at=NOW + 10), 1, 10, NOW + 11)


def test_a_refused_put_counts_nothing_and_other_accounts_have_their_own_tally():
    tally = PutTally()
    small = Room("acme", Quota(messages=5), 0)
    with pytest.raises(QuotaExceeded):
        tally.admit(small, 6, 60, NOW)
    tally.admit(small, 5, 50, NOW)  # the refused six were not counted
    tally.admit(Room("beta", Quota(messages=5), 0), 5, 50, NOW)


def test_stored_bytes_are_estimated_from_the_mean_size_of_the_accounts_puts():
    tally = PutTally()
    room = Room("acme", Quota(bytes=1000), stored_messages=8, counted_at=NOW)
    tally.admit(room, 1, 100, NOW)  # 9 messages of 100 bytes on average: 900
    tally.admit(room, 1, 100, NOW)  # 1000: at the quota, not past it
    with pytest.raises(QuotaExceeded, match="1000 bytes"):
        tally.admit(room, 1, 100, NOW)


def test_quotas_persist_and_no_quota_makes_an_account_unlimited(tmp_path):
    quotas = Quotas(LmdbKV(tmp_path / "q"))
    quotas.set("acme", Quota(queues=2, bytes=10))
    quotas.set("beta", Quota(messages=3))
    quotas.set("free", Quota(queues=1))
    quotas.set("free", NO_QUOTA)
    quotas.set("usual", Quota(queues=1))
    quotas.set("usual", DEFAULT_QUOTA)
    again = Quotas(quotas.kv)
    assert again.get("acme") == Quota(queues=2, bytes=10) and again.get("free") == NO_QUOTA
    assert again.get("usual") == again.get("nobody") == DEFAULT_QUOTA
    assert again.limiting_puts() == {"acme": Quota(queues=2, bytes=10), "beta": Quota(messages=3)}


def test_every_account_but_the_runtimes_own_has_the_default_quota_until_the_admin_sets_one(
        tmp_path):
    kv = LmdbKV(tmp_path / "q")
    accounts, quotas = Accounts(kv), Quotas(kv)
    accounts.create("acme")
    accounts.create("beta")
    quotas.set("beta", Quota(queues=5))  # limits queues only: its puts are free
    assert quotas.get("default") == NO_QUOTA and quotas.get("acme") == DEFAULT_QUOTA
    assert quotas.limiting_puts() == {"acme": DEFAULT_QUOTA}
    accounts.create("gamma")  # made after: limited at once
    assert set(quotas.limiting_puts()) == {"acme", "gamma"}
    with pytest.raises(QuotaExceeded):
        check_queue_quota("acme", quotas.get("acme"), DEFAULT_QUOTA.queues)
    check_queue_quota("default", quotas.get("default"), 10 * DEFAULT_QUOTA.queues)


def queue(name, owner, *sqs, dlq=False):
    subs = tuple(SubqueueInfo(sq, 0, SubqueueState.ALL, 1) for sq in sqs)
    return QueueInfo(name, subs, 1, None, (), 0.0, is_dlq=dlq, owner=owner)


def test_the_manager_counts_queues_without_their_dlqs_and_each_limited_accounts_messages():
    queues = [queue("a", "acme", 1, 2), queue("a-dlq", "acme", 3, dlq=True),
              queue("b", "beta", 4), queue("c", "acme", 5)]
    assert owned_queues(queues, "acme") == 2 and owned_queues(queues, "nobody") == 0
    limited = {"acme": Quota(messages=100)}
    rooms = rooms_of(limited, queues, {1: 10, 2: 5, 3: 1, 4: 1000, 5: 0}, NOW)
    assert rooms == {"acme": Room("acme", Quota(messages=100), 16, NOW)}  # beta is unlimited


def test_put_count_reads_a_put_buffers_messages_without_decoding_them():
    attrs = Attrs("acme", "default", "acme")
    assert put_count(encode_put([(attrs, b"x" * 100)] * 3)) == 3
    assert put_count(b"\x93\x01") == 0 and put_count("text") == 0


def put_request(signer, sq: int, bodies: int):
    batch = encode_put([(Attrs("acme", "default", "acme"), b"x")] * bodies)
    op = SHARD_OPS["put"]
    return op, signer.sign(op, sq, batch, queue="orders"), op.bind(sq, batch)


def test_a_shard_gate_refuses_a_put_past_the_owners_quota_until_a_count_shows_room():
    clock, key = FakeClock(start=time.time()), new_secret()
    counted = [4, clock.now()]  # the manager's count: 4 stored (a quota of 5), and when

    async def fetch():
        room = Room("acme", Quota(messages=5), *counted)
        return {"acme": [key]}, {7: Place("acme/orders", "acme", 0, room=room)}
    gate = Gate(fetch, shard=0, clock=clock)
    signer = Signer("acme", key, clock=clock.now)

    async def scenario():
        assert await gate.admit(*put_request(signer, 7, 1)) == "acme"  # the fifth
        clock.advance(2)  # a refusal fetches the directory again, at most once a second
        with pytest.raises(QuotaExceeded):
            await gate.admit(*put_request(signer, 7, 1))  # the count is the same: a sixth
        counted[:] = [0, clock.now()]  # the account's messages were received and deleted
        clock.advance(2)
        assert await gate.admit(*put_request(signer, 7, 2)) == "acme"  # the refusal fetched
        assert await gate.admit(*put_request(signer, 7, 3)) == "acme"
        with pytest.raises(QuotaExceeded):
            await gate.admit(*put_request(signer, 7, 1))
    asyncio.run(scenario())


def test_a_gate_counts_no_put_of_an_unlimited_owner_nor_the_admins():
    async def fetch():
        return {}, {7: Place("acme/orders", "acme", 0)}
    gate = Gate(fetch, shard=0)

    async def scenario():
        await gate.places()
        await gate.make_room([7], encode_put([(Attrs("acme", "default", "acme"), b"x")] * 9))
    asyncio.run(scenario())
    assert gate.tally._seen == {}
