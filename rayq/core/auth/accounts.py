"""Accounts and HMAC-SHA256 request signing (docs/tenancy-and-auth.md), pure.

Each account has two 256-bit secrets, as Azure storage accounts do, so a key can
be rotated while clients still holding the other one keep working. A client
signs each request over a canonical string of account, queue, operation,
timestamp, nonce and the SHA-256 digest of the request's arguments (bound by name,
:mod:`rayq.core.auth.operations`); the
runtime recomputes it with ``hmac.compare_digest``, refuses timestamps more
than ``skew_s`` away, and refuses a nonce it has seen (a replay).

The account ``default`` is the runtime's own: it always exists, it owns the
queues of unsigned (embedded) clients and it administers the runtime. It has no
keys until an operator gives it one (``rayq account keys default``): its own
clients reach the runtime unsigned, and a key nobody uses is only something to
steal. Keys are stored as they are, since HMAC and SigV4 verification need the
secret itself; the data directory's mode (0700, checked at start) guards them
(docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from rayq.core.auth.operations import Operation
from rayq.core.kit.kv import KV
from rayq.core.codec.model import DEFAULT_ACCOUNT, DLQ_SUFFIX, check_name, fairness_key, pack, unpack
from rayq.core.codec.model import Signature
from rayq.errors import AuthError, InvalidMessage, Overloaded

ADMIN = DEFAULT_ACCOUNT  # the account that administers the runtime
ACCOUNT_ROWS = (b"acct:", b"acct;")  # the meta table's range of account rows
SECRET_BYTES = 32
MAX_SKEW_S = 900.0
MAX_NONCES = 1_000_000  # per verifier: about 150 MB at most
ACCOUNT_NONCE_SHARE = 4  # one account fills at most 1/4 of a verifier's replay window
KEY_SLOTS = (1, 2)
_NONCE_CHARS = 32
QUEUE_SEP = "/"  # "acme/orders": account acme's queue orders
ACCOUNT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # never holds QUEUE_SEP


def new_secret() -> str:
    return base64.urlsafe_b64encode(os.urandom(SECRET_BYTES)).decode("ascii")


def _secret_bytes(secret: Any) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(secret.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, AttributeError, ValueError) as err:
        raise AuthError("not an account key") from err
    if len(raw) != SECRET_BYTES:
        raise AuthError("not an account key")
    return raw




def nonce_digest(account: str, nonce: str) -> int:
    """A 64-bit digest of (account, nonce), stable across processes (unlike ``hash``), so
    remembered nonces can be stored and read back after a restart."""
    data = f"{account}\n{nonce}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def canonical(account: str, queue: str, operation: str, timestamp: float, nonce: str,
              body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([account, queue, operation, f"{timestamp:.6f}", nonce, digest]).encode()


def sign(account: str, secret: str, queue: str, operation: str, body: bytes, now: float) -> Signature:
    nonce = os.urandom(_NONCE_CHARS // 2).hex()
    mac = hmac.new(_secret_bytes(secret), canonical(account, queue, operation, now, nonce, body),
                   hashlib.sha256).hexdigest()
    return Signature(account, queue, operation, now, nonce, mac)


class Signer:
    """A client's credentials: signs each request it makes for ``account``."""

    def __init__(self, account: str, secret: str, clock: Callable[[], float] = time.time):
        check_name(account, "account")
        _secret_bytes(secret)  # a malformed key fails here, not on the first request
        self.account, self._secret, self._clock = account, secret, clock

    def __repr__(self) -> str:  # never show the secret
        return f"Signer({self.account!r})"

    def sign(self, operation: Operation, *args: Any, queue: str | None = None,
             **kwargs: Any) -> Signature:
        """A signature of ``operation`` over its arguments bound by name (defaults filled
        in), for ``queue`` (default: the queue its arguments name, or none)."""
        arguments = operation.bind(*args, **kwargs)
        queue = operation.signed_queue(arguments) if queue is None else queue
        return sign(self.account, self._secret, queue, operation.name,
                    operation.body(arguments), self._clock())


class Accounts:
    """Accounts and their two keys, persisted in a KV's ``meta`` table. The ``default``
    account is made, without keys, on first use."""

    def __init__(self, kv: KV):
        self.kv = kv
        self._keys: dict[str, dict[int, str]] = kv.read(self._load)
        if ADMIN not in self._keys:
            self._keys[ADMIN] = {}
            self._save(ADMIN)

    @staticmethod
    def _load(txn) -> dict[str, dict[int, str]]:
        return {k[5:].decode(): {int(slot): key for slot, key in unpack(v).items()}
                for k, v in txn.scan("meta", *ACCOUNT_ROWS)}

    def _save(self, account: str) -> None:
        record = pack({str(slot): key for slot, key in self._keys[account].items()})
        self.kv.transact(lambda txn: txn.put("meta", b"acct:" + account.encode(), record))

    def __contains__(self, account: str) -> bool:
        return account in self._keys

    def names(self) -> list[str]:
        return sorted(self._keys)

    def create(self, account: str) -> str:
        """A new account; returns its primary key (slot 1). Refuses an existing name and
        names outside letters, digits, '_', '-', '.' (a name is a queue namespace)."""
        if not isinstance(account, str) or not ACCOUNT_NAME.match(account):
            raise InvalidMessage(f"account names are 1-64 chars of letters, digits, '_', '-', "
                                 f"'.': {account!r:.80}")
        if account in self._keys:
            raise InvalidMessage(f"account {account!r} exists")
        self._keys[account] = {slot: new_secret() for slot in KEY_SLOTS}
        self._save(account)
        return self._keys[account][1]

    def rotate(self, account: str, slot: int) -> str:
        """Replace (or, on an account without one there, make) the key in ``slot`` (1 or 2);
        the other keeps working. Returns the new key."""
        if account not in self._keys or slot not in KEY_SLOTS:
            raise AuthError(f"no key {slot!r} of account {account!r}")
        self._keys[account][slot] = new_secret()
        self._save(account)
        return self._keys[account][slot]

    def keys(self, account: Any) -> list[str]:
        return list(self._keys.get(account, {}).values()) if isinstance(account, str) else []

    def table(self) -> dict[str, list[str]]:
        """Every account's current keys (what the runtime's verifiers need)."""
        return {account: list(keys.values()) for account, keys in self._keys.items()}


class SignatureMismatch(AuthError):
    """Raised when the MAC matches none of the account's keys."""


class ReplayedRequest(AuthError):
    """Raised when a signed request's nonce was seen before (also before a restart)."""


_HEX = frozenset("0123456789abcdef")


def _hex(value: str, chars: int) -> bool:
    return len(value) == chars and set(value) <= _HEX


class Verifier:
    """Checks signatures; remembers each (account, nonce) for twice the allowed skew,
    which is as long as a request carrying it could still pass the timestamp check.
    At most ``max_nonces`` are remembered, and at most ``max_nonces_per_account`` of one
    account's: past that, that account's signed requests are shed with Overloaded rather
    than let replays through, memory grow without bound, or one account's burst shed
    everyone's."""

    def __init__(self, keys: Callable[[str], Sequence[str]], skew_s: float = MAX_SKEW_S,
                 max_nonces: int = MAX_NONCES, max_nonces_per_account: int | None = None):
        self.keys, self.skew_s, self.max_nonces = keys, skew_s, max_nonces
        self.max_nonces_per_account = max_nonces_per_account or max(
            1, max_nonces // ACCOUNT_NONCE_SHARE)
        self._seen: set[int] = set()
        self._order: deque[tuple[float, int, str | None]] = deque()
        self._held: dict[str | None, int] = {}  # remembered nonces per account

    def preload(self, digests: Sequence[int], now: float) -> None:
        """Refuse these nonce digests (:func:`nonce_digest`) as seen: what a restarted
        runtime actor reads back from its durable table (see rayq.core.auth.nonces)."""
        for digest in digests:
            if digest not in self._seen:
                self._remember(now, digest, None)  # whose is not stored: nobody's share

    def verify(self, sig: Any, queue: str, operation: str, body: bytes, now: float) -> str:
        """The account a request acts for. Raises AuthError for anything not genuine,
        stale, replayed, or signed for another queue or operation."""
        if not isinstance(sig, Signature) or not all(
                isinstance(v, str) for v in (sig.account, sig.queue, sig.operation, sig.nonce, sig.mac)):
            raise AuthError("the request is not signed")
        if (sig.queue, sig.operation) != (queue, operation):
            raise AuthError("the signature is for another queue or operation")
        if not _within(sig.timestamp, now, self.skew_s):
            raise AuthError("the request's timestamp is outside the allowed window")
        if not (_hex(sig.nonce, _NONCE_CHARS) and _hex(sig.mac, 64)):
            raise AuthError("the request's nonce or signature is malformed")
        expected = canonical(sig.account, queue, operation, sig.timestamp, sig.nonce, body)
        genuine = any(hmac.compare_digest(
            hmac.new(_secret_bytes(key), expected, hashlib.sha256).hexdigest(), sig.mac)
            for key in self.keys(sig.account))
        if not genuine:
            raise SignatureMismatch("the signature does not match the account's keys")
        self._forget_before(now - 2 * self.skew_s)
        seen = nonce_digest(sig.account, sig.nonce)  # 64 bits: a false "replayed" is ~1e-8 at 1M
        if seen in self._seen:
            raise ReplayedRequest("the request was replayed")
        if (len(self._seen) >= self.max_nonces
                or self._held.get(sig.account, 0) >= self.max_nonces_per_account):
            raise Overloaded("too many signed requests in the replay window; retry later")
        self._remember(now, seen, sig.account)
        return sig.account

    def _remember(self, now: float, digest: int, account: str | None) -> None:
        self._seen.add(digest)
        self._order.append((now, digest, account))
        self._held[account] = self._held.get(account, 0) + 1

    def _forget_before(self, cutoff: float) -> None:
        while self._order and self._order[0][0] < cutoff:
            _, digest, account = self._order.popleft()
            self._seen.discard(digest)
            self._held[account] -= 1
            if not self._held[account]:
                del self._held[account]


def _within(timestamp: Any, now: float, skew_s: float) -> bool:
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        return False
    try:
        return math.isfinite(timestamp) and abs(now - float(timestamp)) <= skew_s
    except OverflowError:
        return False


def split_ref(account: str, name: str) -> tuple[str, str]:
    """(owner, queue name) that ``name`` means when ``account`` says it: a plain name is
    the account's own queue, ``owner/name`` names ``owner``'s (the admin reaches every
    account's queues this way, and every account the default account's task queues)."""
    owner, sep, bare = name.partition(QUEUE_SEP)
    return (owner, bare) if sep else (account, name)


def queue_ref(owner: str, name: str) -> str:
    """A queue's runtime-wide name: the default account's queues by their plain name,
    every other account's as ``owner/name``. Queue and account names hold no '/', so
    this is unambiguous."""
    return name if owner == ADMIN else f"{owner}{QUEUE_SEP}{name}"


def resolve_ref(account: str, name: str) -> str:
    """The runtime-wide name of the queue ``account`` means by ``name``."""
    return queue_ref(*split_ref(account, name))


def may_use(account: str, owner: str) -> bool:
    """Whether ``account`` may see and touch what ``owner`` owns: its own, or anything
    for the ``default`` account, which administers the runtime."""
    return account == ADMIN or account == owner


def check_admin(account: str, what: str) -> None:
    if account != ADMIN:
        raise AuthError(f"{what} is for the {ADMIN!r} account only, not {account!r}")


@dataclass(frozen=True)
class Room:
    """What a gate knows of a limited account: its quota, and the messages its queues
    held at the manager's last count over every shard, made at ``counted_at`` (wall
    clock, s)."""

    account: str
    quota: "Quota"  # noqa: F821 - rayq.core.auth.quotas.Quota (quotas imports this module)
    stored_messages: int
    counted_at: float = 0.0


@dataclass(frozen=True)
class Place:
    """Where a subqueue belongs, as a verifier sees it: its queue (runtime-wide name, see
    :func:`queue_ref`), that queue's owner, its shard, and whether it carries tasks
    (which any account may submit to, of the job ``types`` registered on it only), and
    the owner's :class:`~rayq.core.auth.quotas.Room` when a quota limits its puts."""

    queue: str
    owner: str
    shard: int
    tasks: bool = False
    types: frozenset[str] = frozenset()
    room: Room | None = None


def check_access(account: str, queue: str, place: Place | None, shard: int,
                 operation: str) -> None:
    """Raise AuthError unless ``account`` may run ``operation`` on a subqueue at ``place``
    through queue ``queue`` (as the account names it) on shard ``shard``. The queue is
    compared account-qualified: acme's ``orders`` never reaches globex's ``orders``."""
    if account == ADMIN:
        return
    ref = resolve_ref(account, queue) if isinstance(queue, str) else None
    if (ref is None or place is None or place.shard != shard
            or place.queue not in (ref, ref + DLQ_SUFFIX)):
        raise AuthError(f"queue {queue!r} of account {account!r} has no such subqueue here")
    if place.owner == account or (operation == "put" and place.tasks):
        return
    raise AuthError(f"queue {queue!r} is not account {account!r}'s")


def check_senders(account: str, messages: Any, key_mode: str,
                  task_types: Collection[str] | None = None, own_queue: bool = False, *,
                  ordered: bool = False) -> None:
    """Raise AuthError unless every message a put carries is sent as ``account`` and keyed
    for fairness as the runtime would key it: an account can neither pass as another
    tenant nor dodge a suspension or bill its usage to a key of its choosing. With
    ``task_types`` (a put into another owner's task queue) each message's type must be
    one of them: no consumer would run any other, it would only be put back forever.
    ``ordered`` (the put goes to an ordered subqueue, a FIFO queue's): in the account's
    own queue a key is its message group, so the account chooses it; the key is then
    fair only among the queue's groups, which are all the account's. ``own_queue`` (the
    put goes to a queue the account owns that carries no tasks) keys the same way: an
    SQS standard queue is fair across its message groups, all of them the account's.
    The tenant stays the account in every case, so quotas, tenant counts and flood
    detection still see the account."""
    if account == ADMIN:
        return
    if not isinstance(messages, list) or not all(
            isinstance(getattr(m, "tenant", None), str) for m in messages):
        raise AuthError("a put carries a list of messages")
    own_key = (ordered or own_queue) and task_types is None
    for m in messages:
        if m.tenant != account:
            raise AuthError(f"account {account!r} sends messages only as tenant {account!r}")
        if not isinstance(m.type, str) or not own_key and \
                m.key != fairness_key(m.tenant, m.type, key_mode):
            raise AuthError("a message's fairness key does not match its tenant and type")
        if task_types is not None and m.type not in task_types:
            raise AuthError(f"no task type {m.type!r:.80} is registered on this task queue")
