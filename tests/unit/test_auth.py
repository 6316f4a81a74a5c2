"""HMAC-SHA256 signing: forged, expired, replayed, misdirected and rotated requests."""

import dataclasses

import pytest

from rayq.core.auth import Accounts, Verifier, sign
from rayq.core.kv import LmdbKV
from rayq.errors import AuthError, InvalidMessage
from rayq.testing import MemoryKV

NOW = 1_800_000_000.0


@pytest.fixture
def accounts():
    return Accounts(MemoryKV())


def test_a_signed_request_is_verified_and_names_its_account(accounts):
    key = accounts.create("acme")
    sig = sign("acme", key, "jobs", "send", b"body", NOW)
    assert Verifier(accounts).verify(sig, "jobs", "send", b"body", NOW + 10) == "acme"


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
        Verifier(accounts).verify(sig, "jobs", "send", b"body", NOW)


def test_a_changed_body_queue_or_operation_is_refused(accounts):
    sig = sign("acme", accounts.create("acme"), "jobs", "send", b"body", NOW)
    verifier = Verifier(accounts)
    for queue, op, body in [("jobs", "send", b"other"), ("other", "send", b"body"),
                            ("jobs", "delete", b"body")]:
        with pytest.raises(AuthError):
            verifier.verify(sig, queue, op, body, NOW)


@pytest.mark.parametrize("offset", [-901.0, 901.0])
def test_timestamps_outside_fifteen_minutes_are_refused(accounts, offset):
    sig = sign("acme", accounts.create("acme"), "jobs", "send", b"", NOW + offset)
    with pytest.raises(AuthError, match="window"):
        Verifier(accounts).verify(sig, "jobs", "send", b"", NOW)


def test_a_replayed_request_is_refused(accounts):
    sig = sign("acme", accounts.create("acme"), "jobs", "send", b"x", NOW)
    verifier = Verifier(accounts)
    verifier.verify(sig, "jobs", "send", b"x", NOW)
    with pytest.raises(AuthError, match="replayed"):
        verifier.verify(sig, "jobs", "send", b"x", NOW + 1)


def test_rotating_one_key_keeps_the_other_working_and_retires_the_old_one(tmp_path):
    accounts = Accounts(LmdbKV(tmp_path / "a"))
    first = accounts.create("acme")
    second = accounts.keys("acme")[1]
    new = accounts.rotate("acme", 1)
    verifier = Verifier(accounts)
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
        Verifier(accounts).verify("unsigned", "q", "op", b"", NOW)
