"""The gate runtime actors check signed requests with: refreshes of its copy of the
directory, rate-limited, and access checks per subqueue."""

import asyncio

import pytest

from rayq.core.auth import gate as gate_module
from rayq.core.auth.gate import Gate, Vouched, check_reads_own, of_subqueues, per_queue, queues_on
from rayq.core.codec.model import KeyDepth
from rayq.core.auth.accounts import ADMIN, Accounts, Place, Signer
from rayq.core.auth.operations import FLOOD_OPS, MANAGER_OPS, SHARD_OPS
from rayq.errors import AuthError
from rayq.testing import MemoryKV


class FakeManager:
    def __init__(self):
        self.accounts = Accounts(MemoryKV())
        self.places = {1: Place("acme/jobs", "acme", 0)}
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


PEEK, WHOAMI = SHARD_OPS["peek"], MANAGER_OPS["whoami"]


def admit(gate, operation, auth, *args, **kwargs):
    """The gate's check of a call of ``operation`` with these arguments (a coroutine)."""
    return gate.admit(operation, auth, operation.bind(*args, **kwargs))


def test_unsigned_requests_act_for_the_default_account(manager):
    gate = Gate(manager.fetch, shard=0)
    assert run(admit(gate, SHARD_OPS["clear"], None, 99)) == ADMIN and manager.fetches == 0


def test_new_accounts_are_known_after_forget_and_new_subqueues_by_refreshing(manager):
    async def scenario():
        gate = Gate(manager.fetch, shard=0)
        key = manager.accounts.create("acme")
        signer = Signer("acme", key)
        assert await admit(gate, PEEK, signer.sign(PEEK, 1, queue="jobs"), 1) == "acme"
        globex = Signer("globex", manager.accounts.create("globex"))
        with pytest.raises(AuthError):  # not in the copy yet: the manager has not said so
            await admit(gate, WHOAMI, globex.sign(WHOAMI))
        gate.forget()  # what the manager does before create_account returns
        assert await admit(gate, WHOAMI, globex.sign(WHOAMI)) == "globex"
        manager.places[2] = Place("acme/jobs", "acme", 0)  # a subqueue added since
        assert await admit(gate, PEEK, signer.sign(PEEK, 2, queue="jobs"), 2) == "acme"
        return manager.fetches
    assert run(scenario()) == 3


def test_forged_requests_never_make_the_gate_fetch(manager):
    async def scenario():
        gate = Gate(manager.fetch, shard=0)
        await admit(gate, WHOAMI, Signer("default", manager.accounts.rotate("default", 1)).sign(
            WHOAMI))
        forged = Signer("acme", Accounts(MemoryKV()).create("acme"))  # a key nobody issued
        for _ in range(20):
            with pytest.raises(AuthError):
                await admit(gate, PEEK, forged.sign(PEEK, 1, queue="jobs"), 1)
        return manager.fetches
    assert run(scenario()) == 1


def test_a_key_rotated_during_a_fetch_is_not_trusted(manager):
    async def scenario():
        key = manager.accounts.create("acme")
        release, fetching = asyncio.Event(), asyncio.Event()
        first = True

        async def slow_fetch():
            nonlocal first
            directory = await manager.fetch()  # read before the rotation...
            if first:
                first = False
                fetching.set()
                await release.wait()  # ...answered after it
            return directory

        gate = Gate(slow_fetch)
        old = Signer("acme", key)
        pending = asyncio.ensure_future(admit(gate, WHOAMI, old.sign(WHOAMI)))
        await fetching.wait()
        manager.accounts.rotate("acme", 1)
        gate.forget()
        release.set()
        with pytest.raises(AuthError):
            await pending  # the gate fetched again and knows the key is gone
    run(scenario())


def test_subqueue_ids_must_be_integers(manager):
    async def scenario():
        gate = Gate(manager.fetch, shard=0)
        signer = Signer("acme", manager.accounts.create("acme"))
        counts = SHARD_OPS["counts"]
        for junk in ([1], "1", True, None):
            with pytest.raises(AuthError):
                await admit(gate, counts, signer.sign(counts, [junk], queue="jobs"), [junk])
        for junk in ("1", None):  # not a list of ids: names none that may be used
            with pytest.raises(AuthError):
                await admit(gate, counts, signer.sign(counts, junk, queue="jobs"), junk)
    run(scenario())


def test_admin_operations_and_foreign_subqueues_are_refused(manager):
    async def scenario():
        gate = Gate(manager.fetch, shard=0)
        signer = Signer("globex", manager.accounts.create("globex"))
        flooders, clear = FLOOD_OPS["flooders_now"], SHARD_OPS["clear"]
        with pytest.raises(AuthError, match="default"):
            await admit(gate, flooders, signer.sign(flooders))
        with pytest.raises(AuthError):
            await admit(gate, clear, signer.sign(clear, 1, queue="jobs"), 1)
    run(scenario())


def test_only_the_admin_reads_a_whole_shard():
    check_reads_own(ADMIN, None)
    check_reads_own("acme", [1, 2])
    with pytest.raises(AuthError, match="its own subqueues"):
        check_reads_own("acme", None)


def test_reads_keep_the_rows_of_the_named_subqueues_and_counts_sum_per_queue():
    rows = [KeyDepth(1, "a", 3, 0.0, None), KeyDepth(2, "a", 1, 0.0, None),
            KeyDepth(3, "b", 2, 0.0, None)]
    assert of_subqueues(rows, [1, 3]) == [rows[0], rows[2]]
    assert of_subqueues(rows, None) == rows
    places = {1: Place("acme/jobs", "acme", 0), 2: Place("acme/jobs", "acme", 1),
              3: Place("tasks", ADMIN, 0, True)}
    mine = queues_on(places, 0)
    assert mine == {1: "acme/jobs", 3: "tasks"}
    assert per_queue({**mine, 4: "acme/jobs"}, {1: 5, 3: 2, 4: 1}) == {"acme/jobs": 6, "tasks": 2}


def test_a_call_vouched_for_in_process_keeps_every_check_but_the_hmac(manager):
    async def scenario():
        gate = Gate(manager.fetch, shard=0)
        manager.places[2] = Place("globex/own", "globex", 0)
        # acme has no key at all: no signature of it could be verified
        assert await admit(gate, PEEK, Vouched("acme", "jobs"), 1) == "acme"
        with pytest.raises(AuthError):  # vouched for another queue than it names
            await admit(gate, PEEK, Vouched("acme", "other"), 1)
        with pytest.raises(AuthError):  # another account's subqueue
            await admit(gate, PEEK, Vouched("acme", "jobs"), 2)
    run(scenario())
