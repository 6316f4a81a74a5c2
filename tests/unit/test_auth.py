"""HMAC-SHA256 signing: forged, expired, replayed, misdirected and rotated requests."""

import asyncio
import dataclasses

import pytest

from rayq.core.auth.accounts import Accounts, Verifier, sign
from rayq.core.kit.kv import LmdbKV
from rayq.errors import AuthError, InvalidMessage
from rayq.testing import MemoryKV

NOW = 1_800_000_000.0


@pytest.fixture
def accounts():
    return Accounts(MemoryKV())


def test_a_signed_request_is_verified_and_names_its_account(accounts):
    key = accounts.create("acme")
    sig = sign("acme", key, "jobs", "send", b"body", NOW)
    assert Verifier(accounts.keys).verify(sig, "jobs", "send", b"body", NOW + 10) == "acme"


@pytest.mark.parametrize("tamper", [
    lambda s: dataclasses.replace(s, mac="0" * 64),                # forged
    lambda s: dataclasses.replace(s, account="globex"),            # someone else's name
    lambda s: dataclasses.replace(s, timestamp=s.timestamp + 1),   # altered timestamp
    lambda s: dataclasses.replace(s, nonce="f" * 32),              # altered nonce
])
def test_forged_or_altered_signatures_are_refused(accounts, tamper):
    accounts.create("globex")
    sig = tamper(sign("acme", accounts.create("acme"), "jobs", "send", b"body", NOW))
    with pytest.raises(AuthError):
        Verifier(accounts.keys).verify(sig, "jobs", "send", b"body", NOW)


def test_a_changed_body_queue_or_operation_is_refused(accounts):
    sig = sign("acme", accounts.create("acme"), "jobs", "send", b"body", NOW)
    verifier = Verifier(accounts.keys)
    for queue, op, body in [("jobs", "send", b"other"), ("other", "send", b"body"),
                            ("jobs", "delete", b"body")]:
        with pytest.raises(AuthError):
            verifier.verify(sig, queue, op, body, NOW)


@pytest.mark.parametrize("offset", [-901.0, 901.0])
def test_timestamps_outside_fifteen_minutes_are_refused(accounts, offset):
    sig = sign("acme", accounts.create("acme"), "jobs", "send", b"", NOW + offset)
    with pytest.raises(AuthError, match="window"):
        Verifier(accounts.keys).verify(sig, "jobs", "send", b"", NOW)


def test_a_replayed_request_is_refused(accounts):
    sig = sign("acme", accounts.create("acme"), "jobs", "send", b"x", NOW)
    verifier = Verifier(accounts.keys)
    verifier.verify(sig, "jobs", "send", b"x", NOW)
    with pytest.raises(AuthError, match="replayed"):
        verifier.verify(sig, "jobs", "send", b"x", NOW + 1)


def test_rotating_one_key_keeps_the_other_working_and_retires_the_old_one(tmp_path):
    accounts = Accounts(LmdbKV(tmp_path / "a"))
    first = accounts.create("acme")
    second = accounts.keys("acme")[1]
    new = accounts.rotate("acme", 1)
    verifier = Verifier(accounts.keys)
    assert verifier.verify(sign("acme", second, "q", "op", b"", NOW), "q", "op", b"", NOW) == "acme"
    assert verifier.verify(sign("acme", new, "q", "op", b"", NOW), "q", "op", b"", NOW) == "acme"
    with pytest.raises(AuthError):
        verifier.verify(sign("acme", first, "q", "op", b"", NOW), "q", "op", b"", NOW)
    accounts.kv.close()
    assert Accounts(LmdbKV(tmp_path / "a")).keys("acme") == [new, second]  # persisted


def test_account_names_and_keys_are_checked(accounts):
    accounts.create("acme")
    with pytest.raises(InvalidMessage):
        accounts.create("acme")
    with pytest.raises(InvalidMessage):
        accounts.create("")
    with pytest.raises(AuthError):
        accounts.rotate("acme", 3)
    with pytest.raises(AuthError):
        sign("acme", "not-a-key", "q", "op", b"", NOW)
    with pytest.raises(AuthError):
        Verifier(accounts.keys).verify("unsigned", "q", "op", b"", NOW)


def test_the_default_account_always_exists_and_cannot_be_made_again(accounts):
    assert "default" in accounts
    with pytest.raises(InvalidMessage):
        accounts.create("default")


def test_the_default_account_has_no_keys_until_an_operator_gives_it_one(accounts):
    assert accounts.keys("default") == [] and accounts.table()["default"] == []
    key = accounts.rotate("default", 2)
    assert accounts.keys("default") == [key]
    assert Accounts(accounts.kv).keys("default") == [key]  # remembered


def test_a_signer_signs_the_arguments_themselves(accounts):
    from rayq.core.auth.accounts import Signer
    from rayq.core.auth.operations import SHARD_OPS
    from rayq.core.codec.model import NewMessage

    key, put = accounts.create("acme"), SHARD_OPS["put"]
    message = NewMessage(b"\x01hi", "acme", "report", "report")
    sig = Signer("acme", key, clock=lambda: NOW).sign(put, 7, [message], queue="jobs")
    verifier = Verifier(accounts.keys)

    def body(subqueue, messages):
        return put.body(put.bind(subqueue, messages))
    with pytest.raises(AuthError):  # another subqueue, same message
        verifier.verify(sig, "jobs", put.name, body(8, [message]), NOW)
    changed = dataclasses.replace(message, tenant="globex")
    with pytest.raises(AuthError):
        verifier.verify(sig, "jobs", put.name, body(7, [changed]), NOW)
    assert verifier.verify(sig, "jobs", put.name, body(7, [message]), NOW) == "acme"
    assert "secret" not in repr(Signer("acme", key)) and key not in repr(Signer("acme", key))


def test_malformed_credentials_and_signatures_are_auth_errors(accounts):
    from rayq.core.auth.accounts import Signer

    with pytest.raises(AuthError):
        Signer("acme", "too-short")
    sig = sign("acme", accounts.create("acme"), "q", "op", b"", NOW)
    verifier = Verifier(accounts.keys)
    for bad in (None, "sig", dataclasses.replace(sig, account=7), dataclasses.replace(sig, nonce="x"),
                dataclasses.replace(sig, timestamp=float("nan")),
                dataclasses.replace(sig, timestamp=True)):
        with pytest.raises(AuthError):
            verifier.verify(bad, "q", "op", b"", NOW)


def test_nonces_are_remembered_for_twice_the_skew_and_bounded(accounts):
    from rayq.errors import Overloaded

    key = accounts.create("acme")
    verifier = Verifier(accounts.keys, max_nonces=2, max_nonces_per_account=2)
    for at in (NOW, NOW + 10):
        verifier.verify(sign("acme", key, "q", "op", b"", at), "q", "op", b"", at)
    with pytest.raises(Overloaded):  # full: shed, rather than forget a nonce too early
        verifier.verify(sign("acme", key, "q", "op", b"", NOW + 20), "q", "op", b"", NOW + 20)
    later = NOW + 1799  # the first nonce could still be replayed until NOW + 1800
    with pytest.raises(Overloaded):
        verifier.verify(sign("acme", key, "q", "op", b"", later), "q", "op", b"", later)
    later = NOW + 1801
    assert verifier.verify(sign("acme", key, "q", "op", b"", later), "q", "op", b"", later) == "acme"


def test_huge_or_odd_timestamps_and_macs_are_auth_errors(accounts):
    sig = sign("acme", accounts.create("acme"), "q", "op", b"", NOW)
    verifier = Verifier(accounts.keys)
    for bad in (dataclasses.replace(sig, timestamp=10**400), dataclasses.replace(sig, mac="é" * 64),
                dataclasses.replace(sig, mac=sig.mac.upper()),
                dataclasses.replace(sig, timestamp=float("inf"))):
        with pytest.raises(AuthError):
            verifier.verify(bad, "q", "op", b"", NOW)


@pytest.mark.parametrize("account, queue, place, operation, allowed", [
    ("acme", "jobs", ("acme/jobs", "acme", 0, False), "receive", True),
    ("acme", "jobs", ("acme/jobs-dlq", "acme", 0, False), "receive", True),  # its dead letters
    ("acme", "jobs", ("globex/jobs", "globex", 0, False), "receive", False),  # same name, globex's
    ("acme", "globex/jobs", ("globex/jobs", "globex", 0, False), "receive", False),  # named outright
    ("acme", "jobs", ("acme/other", "acme", 0, False), "receive", False),     # not the signed queue
    ("acme", "jobs", ("acme/jobs", "acme", 1, False), "receive", False),      # on another shard
    ("acme", "jobs", None, "receive", False),                                 # unknown subqueue
    ("acme", "default/jobs", ("jobs", "default", 0, True), "put", True),      # a task queue: submit
    ("acme", "jobs", ("jobs", "default", 0, True), "put", False),             # plain: acme's own
    ("acme", "default/jobs", ("jobs", "default", 0, True), "receive", False),  # but not receive
    ("acme", "default/jobs", ("jobs", "default", 0, False), "put", False),    # a plain admin queue
    ("default", "jobs", None, "clear", True),                                 # the admin
])
def test_access_rules_compare_the_account_qualified_queue(account, queue, place, operation,
                                                          allowed):
    from rayq.core.auth.accounts import Place, check_access

    place = Place(*place) if place else None
    if allowed:
        check_access(account, queue, place, 0, operation)
    else:
        with pytest.raises(AuthError):
            check_access(account, queue, place, 0, operation)


@pytest.mark.parametrize("account, name, ref", [
    ("acme", "orders", "acme/orders"), ("default", "orders", "orders"),
    ("default", "acme/orders", "acme/orders"), ("acme", "default/tasks", "tasks"),
    ("globex", "acme/orders", "acme/orders"),
])
def test_a_queue_name_means_a_queue_of_the_speakers_namespace(account, name, ref):
    from rayq.core.auth.accounts import resolve_ref

    assert resolve_ref(account, name) == ref


@pytest.mark.parametrize("name", ["a/b", "", "x" * 65, "acme corp", "é"])
def test_account_names_cannot_hold_a_namespace_separator_or_odd_chars(accounts, name):
    with pytest.raises(InvalidMessage):
        accounts.create(name)


@pytest.mark.parametrize("tenant, key, allowed", [
    ("acme", "report", True), ("globex", "report", False),    # impersonation
    ("acme", "anything", False),                              # a key of its own choosing
])
def test_an_account_sends_as_itself_keyed_as_the_runtime_keys(tenant, key, allowed):
    from rayq.core.auth.accounts import check_senders
    from rayq.core.codec.model import NewMessage

    messages = [NewMessage(b"\x01", "acme", "report", "report"),
                NewMessage(b"\x01", tenant, "report", key)]
    if allowed:
        check_senders("acme", messages, "type")
    else:
        with pytest.raises(AuthError):
            check_senders("acme", messages, "type")
    for junk in (None, "x", [object()]):
        with pytest.raises(AuthError):
            check_senders("acme", junk, "type")
    check_senders("default", [NewMessage(b"\x01", "any", "report", "free")], "type")


def test_an_account_puts_into_a_task_queue_only_the_types_registered_on_it():
    from rayq.core.auth.accounts import check_senders
    from rayq.core.codec.model import NewMessage

    def message(type_):
        return NewMessage(b"\x01", "acme", type_, type_)
    check_senders("acme", [message("report")], "type", task_types={"report"})
    with pytest.raises(AuthError, match="registered"):
        check_senders("acme", [message("report"), message("nobody-runs-this")], "type",
                      task_types={"report"})
    check_senders("acme", [message("anything")], "type")  # its own queue: any type


def test_the_gate_limits_types_only_on_another_owners_task_queue():
    from rayq.core.auth.accounts import Place
    from rayq.core.auth.gate import Gate

    async def fetch():
        return {}, {1: Place("jobs", "default", 0, True, frozenset({"report"})),
                    2: Place("acme/orders", "acme", 0)}
    gate = Gate(fetch)
    asyncio.run(gate.places())
    assert gate.task_types("acme", 1) == {"report"}
    assert gate.task_types("default", 1) is None and gate.task_types("acme", 2) is None


def test_one_accounts_burst_fills_only_its_share_of_the_replay_window(accounts):
    from rayq.core.auth.accounts import Signer
    from rayq.core.auth.operations import SHARD_OPS
    from rayq.errors import Overloaded
    keys = {name: accounts.create(name) for name in ("noisy", "quiet")}
    verifier = Verifier(accounts.keys, max_nonces=8, max_nonces_per_account=3)
    clear = SHARD_OPS["clear"]

    def send(name):
        sig = Signer(name, keys[name], clock=lambda: NOW).sign(clear, 1, queue="q")
        return verifier.verify(sig, "q", clear.name, clear.body(clear.bind(1)), NOW)
    for _ in range(3):
        send("noisy")
    with pytest.raises(Overloaded):
        send("noisy")
    assert send("quiet") == "quiet"  # the other account is not shed
    verifier = Verifier(accounts.keys, max_nonces=8, max_nonces_per_account=3)
    verifier.preload([1, 2, 3, 4], NOW)  # read back after a restart: nobody's share
    assert [send("noisy") for _ in range(3)] == ["noisy"] * 3


def test_an_account_keys_its_own_ordered_queue_by_message_group_but_not_a_task_queue():
    from rayq.core.auth.accounts import check_senders
    from rayq.core.codec.model import NewMessage

    grouped = [NewMessage(b"\x01", "acme", "report", "group-7")]
    check_senders("acme", grouped, "type", ordered=True)
    with pytest.raises(AuthError):
        check_senders("acme", grouped, "type")  # an unordered queue: the runtime's key
    with pytest.raises(AuthError):
        check_senders("acme", grouped, "type", task_types={"report"}, ordered=True)
    with pytest.raises(AuthError):  # the tenant stays the account's
        check_senders("acme", [NewMessage(b"\x01", "bob", "report", "g")], "type", ordered=True)


def test_an_account_keys_its_own_plain_queue_by_message_group_never_as_another_tenant():
    from rayq.core.auth.accounts import check_senders
    from rayq.core.codec.model import NewMessage

    grouped = [NewMessage(b"\x01", "acme", "report", "group-7")]
    check_senders("acme", grouped, "type", None, True)  # its own standard queue
    with pytest.raises(AuthError):  # another owner's task queue: the runtime's key only
        check_senders("acme", grouped, "type", {"report"}, True)
    with pytest.raises(AuthError):
        check_senders("acme", [NewMessage(b"\x01", "bob", "report", "g")], "type", None, True)
