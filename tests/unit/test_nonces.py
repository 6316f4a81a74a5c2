"""Seen nonces kept durable: a verifier that restarts still refuses what it saw, the
table forgets entries past the window, and a shard writes a nonce in the same
transaction as the request it signs."""

import asyncio

import pytest

from rayq.core.auth.gate import durable_gate
from rayq.core.auth import nonces
from rayq.core.auth.accounts import MAX_SKEW_S, Accounts, Signer, Verifier, sign
from rayq.core.auth.operations import MANAGER_OPS
from rayq.core.kit.kv import LmdbKV
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.storage.store import ShardStore
from rayq.core.codec.wire import encode_messages
from rayq.errors import AuthError, StoreError
from rayq.testing import FakeClock, MemoryKV, plenty_of_memory
from rayq.core.storage.writes import Put

NOW = 1_800_000_000.0


@pytest.fixture
def accounts():
    return Accounts(MemoryKV())


def _seen_nonces(kv) -> list[bytes]:
    return kv.read(lambda txn: [k for k, _ in txn.scan(nonces.TABLE, b"")])


def test_a_verifier_reopened_on_the_table_refuses_a_request_seen_before(tmp_path, accounts):
    key = accounts.create("acme")
    seen = sign("acme", key, "jobs", "put", b"body", NOW)
    kv = LmdbKV(tmp_path / "shard")
    assert Verifier(accounts.keys).verify(seen, "jobs", "put", b"body", NOW) == "acme"
    kv.transact(lambda txn: nonces.remember(txn, [nonces.nonce_key(seen)], NOW))
    kv.close()

    restarted = Verifier(accounts.keys)
    restarted.preload(nonces.load(LmdbKV(tmp_path / "shard"), NOW + 60), NOW + 60)
    with pytest.raises(AuthError, match="replayed"):
        restarted.verify(seen, "jobs", "put", b"body", NOW + 60)
    fresh = sign("acme", key, "jobs", "put", b"body", NOW + 60)
    assert restarted.verify(fresh, "jobs", "put", b"body", NOW + 60) == "acme"


def test_entries_past_the_window_are_forgotten_and_the_rest_kept(accounts):
    key, kv = accounts.create("acme"), MemoryKV()
    window = 2 * MAX_SKEW_S
    old = [nonces.nonce_key(sign("acme", key, "q", "put", b"", NOW - window - 10 - i))
           for i in range(5)]
    recent = nonces.nonce_key(sign("acme", key, "q", "put", b"", NOW - window + 10))
    kv.transact(lambda txn: nonces.remember(txn, old + [recent], NOW - window))
    assert len(_seen_nonces(kv)) == 6
    kv.transact(lambda txn: nonces.remember(txn, [], NOW, expire_limit=2))  # bounded per write
    assert len(_seen_nonces(kv)) == 4
    assert nonces.load(kv, NOW) == [int.from_bytes(recent[8:], "big")]
    assert _seen_nonces(kv) == [recent]


def _store(kv) -> ShardStore:
    return ShardStore(kv, clock=FakeClock(NOW), memory_probe=plenty_of_memory)


def test_a_group_commit_writes_its_nonces_in_the_same_transaction(accounts):
    store = _store(MemoryKV())
    message = NewMessage(encode_body("m", 1 << 20), "acme", "report", "report")
    key = nonces.nonce_key(sign("acme", accounts.create("acme"), "q", "put", b"", NOW))
    [ids] = store.group([Put(1, encode_messages([message]))],
                        also=lambda txn: nonces.remember(txn, [key], NOW))
    assert len(ids) == 1 and _seen_nonces(store.kv) == [key]

    def broken(txn):
        txn.put(nonces.TABLE, b"n" * 16, b"")
        raise OSError("disk gone")

    with pytest.raises(StoreError) as raised:
        store.group([Put(1, encode_messages([message]))], also=broken)
    assert isinstance(raised.value.__cause__, OSError)  # the engine failed, chained
    assert store.count(1) == 1 and _seen_nonces(store.kv) == [key]  # neither was written


def test_a_durable_gate_remembers_across_a_restart(accounts):
    kv, key = MemoryKV(), accounts.create("acme")

    async def fetch():
        return accounts.table(), {}

    signer, whoami = Signer("acme", key), MANAGER_OPS["whoami"]
    captured = signer.sign(whoami)
    assert asyncio.run(durable_gate(fetch, kv).admit(whoami, captured, {})) == "acme"
    with pytest.raises(AuthError, match="replayed"):  # a new gate on the same table: restarted
        asyncio.run(durable_gate(fetch, kv).admit(whoami, captured, {}))
    assert asyncio.run(durable_gate(fetch, kv).admit(whoami, signer.sign(whoami), {})) == "acme"
    assert len(_seen_nonces(kv)) == 2
