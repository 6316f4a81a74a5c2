"""HMAC-SHA256 request signing for accounts (seed 003's shared-key scheme), pure.

Each account has two 256-bit secrets, as Azure storage accounts do, so a key can
be rotated while clients still holding the other one keep working. A request
is signed over a canonical string of account, queue, operation, timestamp,
nonce and the SHA-256 digest of its body; the verifier recomputes it with
``hmac.compare_digest``, refuses timestamps more than ``skew_s`` away, and
refuses a nonce it has seen within the window (a replay).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

from rayq.core.kv import KV
from rayq.core.model import check_name, pack, unpack
from rayq.errors import AuthError, InvalidMessage

SECRET_BYTES = 32
MAX_SKEW_S = 900.0
KEY_SLOTS = (1, 2)


def new_secret() -> str:
    return base64.urlsafe_b64encode(os.urandom(SECRET_BYTES)).decode("ascii")


def _secret_bytes(secret: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(secret.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, AttributeError, ValueError) as err:
        raise AuthError("not an account key") from err
    if len(raw) != SECRET_BYTES:
        raise AuthError("not an account key")
    return raw


@dataclass(frozen=True)
class Signature:
    """What travels with a signed request besides its body."""

    account: str
    queue: str
    operation: str
    timestamp: float
    nonce: str
    mac: str


def canonical(account: str, queue: str, operation: str, timestamp: float, nonce: str,
              body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([account, queue, operation, f"{timestamp:.6f}", nonce, digest]).encode()


def sign(account: str, secret: str, queue: str, operation: str, body: bytes, now: float) -> Signature:
    nonce = os.urandom(16).hex()
    mac = hmac.new(_secret_bytes(secret), canonical(account, queue, operation, now, nonce, body),
                   hashlib.sha256).hexdigest()
    return Signature(account, queue, operation, now, nonce, mac)


class Accounts:
    """Accounts and their two keys, persisted in a KV's ``meta`` table."""

    def __init__(self, kv: KV):
        self.kv = kv
        self._keys: dict[str, dict[int, str]] = kv.read(self._load)

    @staticmethod
    def _load(txn) -> dict[str, dict[int, str]]:
        return {k[5:].decode(): {int(slot): key for slot, key in unpack(v).items()}
                for k, v in txn.scan("meta", b"acct:", b"acct;")}

    def _save(self, account: str) -> None:
        record = pack({str(slot): key for slot, key in self._keys[account].items()})
        self.kv.transact(lambda txn: txn.put("meta", b"acct:" + account.encode(), record))

    def create(self, account: str) -> str:
        """A new account; returns its primary key (slot 1). Refuses an existing name."""
        check_name(account, "account")
        if account in self._keys:
            raise InvalidMessage(f"account {account!r} exists")
        self._keys[account] = {slot: new_secret() for slot in KEY_SLOTS}
        self._save(account)
        return self._keys[account][1]

    def rotate(self, account: str, slot: int) -> str:
        """Replace the key in ``slot`` (1 or 2); the other keeps working. Returns the new key."""
        if account not in self._keys or slot not in KEY_SLOTS:
            raise AuthError(f"no key {slot!r} of account {account!r}")
        self._keys[account][slot] = new_secret()
        self._save(account)
        return self._keys[account][slot]

    def keys(self, account: str) -> list[str]:
        return list(self._keys.get(account, {}).values())


class Verifier:
    """Checks signatures; remembers nonces for twice the allowed skew."""

    def __init__(self, accounts: Accounts, skew_s: float = MAX_SKEW_S):
        self.accounts, self.skew_s = accounts, skew_s
        self._seen: dict[str, float] = {}

    def verify(self, sig: Signature, queue: str, operation: str, body: bytes, now: float) -> str:
        """The account a request acts for. Raises AuthError for anything not genuine,
        stale, replayed, or signed for another queue or operation."""
        if not isinstance(sig, Signature) or not isinstance(body, bytes):
            raise AuthError("the request is not signed")
        if (sig.queue, sig.operation) != (queue, operation):
            raise AuthError("the signature is for another queue or operation")
        if not isinstance(sig.timestamp, (int, float)) or abs(now - sig.timestamp) > self.skew_s:
            raise AuthError("the request's timestamp is outside the allowed window")
        expected = canonical(sig.account, queue, operation, sig.timestamp, sig.nonce, body)
        genuine = any(hmac.compare_digest(
            hmac.new(_secret_bytes(key), expected, hashlib.sha256).hexdigest(), str(sig.mac))
            for key in self.accounts.keys(sig.account))
        if not genuine:
            raise AuthError("the signature does not match")
        self._forget_before(now - 2 * self.skew_s)
        if sig.nonce in self._seen:
            raise AuthError("the request was replayed")
        self._seen[sig.nonce] = now
        return sig.account

    def _forget_before(self, cutoff: float) -> None:
        for nonce in [n for n, at in self._seen.items() if at < cutoff]:
            del self._seen[nonce]
