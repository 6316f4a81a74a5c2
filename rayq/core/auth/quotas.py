"""Per-account quotas: how many queues an account may own, and how many messages and
bytes its queues may hold. The admin sets them (``Client.set_quota``); until then an
account has :data:`DEFAULT_QUOTA`, and the ``default`` account (the runtime's own, what
a single-tenant user acts as) none. docs/security.md says why each default is what it
is.

Queues are counted exactly, by the manager, when a queue is created. Messages and
bytes are checked by each shard's gate on put, approximately: the manager publishes,
with the directory gates verify with, each limited account's :class:`Room` (its quota
and the messages its queues held at the manager's last count over every shard, about
once a second), and a gate adds what it admitted itself after that count
(:class:`PutTally`). A gate does not see the puts other shards admitted meanwhile,
nor deletes since its copy of the count, so an account spread over several shards
may pass its quota by what the others took since the last count, and one that made
room waits for a fresher copy (a refused put fetches the directory again, at most
once a second; it is otherwise up to 30 s old). rayq keeps no per-account byte
count on disk: stored bytes are estimated as stored messages times the mean size of
the account's puts this gate admitted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from rayq.core.auth.accounts import ACCOUNT_ROWS, ADMIN, Room  # Room: re-exported here
from rayq.core.codec.model import pack, unpack
from rayq.core.kit.kv import KV
from rayq.errors import InvalidMessage, QuotaExceeded

LIMITS = ("queues", "messages", "bytes")
BUCKET_S = 1.0  # a gate's admitted puts are kept per this much time


@dataclass(frozen=True)
class Quota:
    """An account's limits; None: unlimited."""

    queues: int | None = None
    messages: int | None = None
    bytes: int | None = None

    @property
    def limits_puts(self) -> bool:
        return self.messages is not None or self.bytes is not None


NO_QUOTA = Quota()
# What an account may hold before the admin says otherwise: far past one application's
# needs, short of what lets one tenant fill the registry or a shard's disk.
DEFAULT_QUOTA = Quota(queues=1000, messages=10_000_000, bytes=64 << 30)


def quota_of(queues: Any = None, messages: Any = None, bytes: Any = None) -> Quota:
    """A Quota from what the admin asks. Raises InvalidMessage unless each is None or an
    integer >= 0."""
    for name, value in zip(LIMITS, (queues, messages, bytes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise InvalidMessage(f"a quota's {name} is an integer >= 0 or None: {value!r:.40}")
    return Quota(queues, messages, bytes)


class Quotas:
    """Each account's quota, persisted in a KV's ``meta`` table (``quota:<account>``)."""

    def __init__(self, kv: KV):
        self.kv = kv
        self._by_account: dict[str, Quota] = kv.read(
            lambda txn: {k[6:].decode(): Quota(*unpack(v))
                         for k, v in txn.scan("meta", b"quota:", b"quota;")})

    def get(self, account: str) -> Quota:
        """``account``'s quota: the one the admin set, else DEFAULT_QUOTA (the ``default``
        account's is NO_QUOTA)."""
        return self._by_account.get(account, default_quota(account))

    def set(self, account: str, quota: Quota) -> Quota:
        """Replace ``account``'s quota (NO_QUOTA: unlimited); returns it."""
        key = b"quota:" + account.encode()
        if quota == default_quota(account):  # kept as no record: the default may change
            self.kv.transact(lambda txn: txn.delete("meta", key))
            self._by_account.pop(account, None)
        else:
            record = pack([quota.queues, quota.messages, quota.bytes])
            self.kv.transact(lambda txn: txn.put("meta", key, record))
            self._by_account[account] = quota
        return quota

    def limiting_puts(self) -> dict[str, Quota]:
        """The accounts whose puts a quota limits (every account on the default quota)."""
        names = self.kv.read(lambda txn: [k[len(ACCOUNT_ROWS[0]):].decode()
                                          for k, _ in txn.scan("meta", *ACCOUNT_ROWS)])
        quotas = {name: self.get(name) for name in names}
        return {a: q for a, q in {**quotas, **self._by_account}.items() if q.limits_puts}


def default_quota(account: str) -> Quota:
    """The quota of an account the admin set none on."""
    return NO_QUOTA if account == ADMIN else DEFAULT_QUOTA


def check_queue_quota(account: str, quota: Quota, owned: int) -> None:
    """Raise QuotaExceeded when ``account``, owning ``owned`` queues, may not make one more."""
    if quota.queues is not None and owned >= quota.queues:
        raise QuotaExceeded(f"account {account!r} owns {owned} queues, its quota")


def over_quota(quota: Quota, messages: int, size_bytes: float) -> str | None:
    """Which limit holding ``messages`` messages of ``size_bytes`` would pass (None: none)."""
    if quota.messages is not None and messages > quota.messages:
        return f"{quota.messages} messages"
    if quota.bytes is not None and size_bytes > quota.bytes:
        return f"{quota.bytes} bytes"
    return None


class PutTally:
    """A gate's record of the puts it admitted per limited account: those after the
    manager's count (added to it), and the totals since it started (their mean size
    estimates stored bytes)."""

    def __init__(self):
        self._recent: dict[str, deque[tuple[float, int]]] = {}  # (admitted at, messages)
        self._recent_total: dict[str, int] = {}
        self._seen: dict[str, tuple[int, int]] = {}  # account -> (messages, bytes) admitted

    def admit(self, room: Room, messages: int, size_bytes: int, now: float) -> None:
        """Count a put of ``messages`` messages in ``size_bytes`` at ``now``. Raises
        QuotaExceeded (counting nothing) when the account's queues would then pass its
        quota."""
        account = room.account
        held = room.stored_messages + self._after(account, room.counted_at) + messages
        seen_messages, seen_bytes = self._seen.get(account, (0, 0))
        seen_messages, seen_bytes = seen_messages + messages, seen_bytes + size_bytes
        passed = over_quota(room.quota, held, held * seen_bytes / max(seen_messages, 1))
        if passed is not None:
            raise QuotaExceeded(f"account {account!r}'s queues would hold more than its "
                                f"quota of {passed}")
        recent = self._recent.setdefault(account, deque())
        # Kept by the second, so memory stays bounded: a put joins the bucket under its
        # earlier time, which a count forgets later, never too soon.
        if recent and now - recent[-1][0] < BUCKET_S:
            recent[-1] = (recent[-1][0], recent[-1][1] + messages)
        else:
            recent.append((now, messages))
        self._recent_total[account] = self._recent_total.get(account, 0) + messages
        self._seen[account] = (seen_messages, seen_bytes)

    def _after(self, account: str, counted_at: float) -> int:
        """Messages admitted for ``account`` at or after ``counted_at`` (older ones are
        in the count: forgotten here)."""
        recent = self._recent.get(account)
        while recent and recent[0][0] < counted_at:
            self._recent_total[account] -= recent.popleft()[1]
        return self._recent_total.get(account, 0)
