"""The gate runtime actors check signed requests with: refreshes of its copy of the
directory, rate-limited, and access checks per subqueue."""

import asyncio

import pytest

from actors import gate as gate_module
from actors.gate import Gate
from rayq.core.auth import ADMIN, Accounts, Place, Signer
from rayq.errors import AuthError
from rayq.testing import MemoryKV


class FakeManager:
    def __init__(self):
        self.accounts = Accounts(MemoryKV())
        self.places = {1: Place("jobs", "acme", 0)}
        self.fetches = 0

    async def fetch(self):
        self.fetches += 1
        return self.accounts.table(), dict(self.places)


@pytest.fixture
def manager(monkeypatch):
    monkeypatch.setattr(gate_module, "MIN_REFRESH_S", 0.05)
    return FakeManager()


def run(coro):
    return asyncio.run(coro)


def test_unsigned_requests_act_for_the_default_account(manager):
    gate = Gate(manager.fetch)
    assert run(gate.allow(None, "clear", 0, [99], 99)) == ADMIN and manager.fetches == 0


def test_a_new_account_and_a_new_subqueue_are_found_by_refreshing(manager):
    async def scenario():
        gate = Gate(manager.fetch)
        key = manager.accounts.create("acme")
        signer = Signer("acme", key)
        assert await gate.allow(signer.sign("jobs", "peek", 1), "peek", 0, [1], 1) == "acme"
        manager.places[2] = Place("jobs", "acme", 0)
        globex = Signer("globex", manager.accounts.create("globex"))
        assert await gate.account(globex.sign("", "whoami"), "", "whoami") == "globex"
        assert await gate.allow(signer.sign("jobs", "peek", 2), "peek", 0, [2], 2) == "acme"
        return manager.fetches
    assert run(scenario()) == 2  # the refresh that found globex found subqueue 2 too


def test_forged_requests_wait_for_a_refresh_instead_of_hammering_the_manager(manager):
    async def scenario():
        gate = Gate(manager.fetch)
        forged = Signer("acme", Accounts(MemoryKV()).create("acme"))  # a key nobody issued
        for _ in range(5):
            with pytest.raises(AuthError):
                await gate.account(forged.sign("jobs", "peek", 1), "jobs", "peek", 1)
        return manager.fetches
    fetches = run(scenario())
    assert 1 <= fetches <= 6  # at most one fetch per forged request, spaced MIN_REFRESH_S


def test_admin_operations_and_foreign_subqueues_are_refused(manager):
    async def scenario():
        gate = Gate(manager.fetch)
        signer = Signer("globex", manager.accounts.create("globex"))
        with pytest.raises(AuthError):
            await gate.admin(signer.sign("", "flooders"), "flooders")
        with pytest.raises(AuthError):
            await gate.allow(signer.sign("jobs", "clear", 1), "clear", 0, [1], 1)
    run(scenario())
