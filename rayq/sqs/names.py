"""Names between SQS and rayq: account ids, queue URLs and ARNs, and the rayq queue
that holds an SQS queue of a region.

SQS names an account by a 12-digit id (in queue URLs and ARNs); rayq by its name.
The id is derived from the name, so it needs no directory and never changes. SQS's
regions are separate namespaces: a queue of the endpoint's home region is the rayq
queue of the same name (what rayq's own clients see), a queue of another region is
``<region>:<name>``. SQS allows names ending in ``-dlq``, which rayq keeps for the
dead-letter queue it makes with each queue: such a name is stored with ``.q`` after
it. A rayq name that does end in ``-dlq`` is one of rayq's own: it shows as the SQS
queue of that name only while its queue dead-letters into it (rayq's ``max_receives``),
and no queue of the SQS name was made (:meth:`rayq.sqs.target.Target.ref`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from functools import lru_cache

from rayq.core.codec.model import DLQ_SUFFIX

HOME_REGION = "us-east-1"
FIFO_SUFFIX = ".fifo"
_ESCAPE = ".q"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_FIFO_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")
_ACCOUNT_ID = re.compile(r"^\d{12}$")
_ARN = re.compile(r"^arn:aws[a-z-]*:sqs:([a-z0-9-]+):(\d{12}|[^:]+):([A-Za-z0-9_.-]+)$")


@lru_cache(maxsize=4096)
def account_id(account: str) -> str:
    """The 12-digit id of a rayq account, as SQS's URLs and ARNs name it."""
    digest = hashlib.sha256(b"rayq-account:" + account.encode()).digest()
    return f"{int.from_bytes(digest[:8], 'big') % 10**12:012d}"


def access_key_id(account: str, key: str) -> str:
    """The AKIA-shaped access key id of one of an account's keys: derived from the key, so
    a rotated key has a new id, and the id tells nothing of the key. The account name
    itself still works as an access key id."""
    digest = hmac.new(key.encode(), b"rayq-access-key:" + account.encode(), hashlib.sha256)
    return "AKIA" + base64.b32encode(digest.digest()).decode()[:16]


def is_account_id(text: str) -> bool:
    return bool(_ACCOUNT_ID.match(text))


def valid_region(region: object) -> bool:
    return isinstance(region, str) and bool(_REGION.match(region))


def valid_name(name: object) -> bool:
    """Whether ``name`` is a queue name SQS accepts (standard, or FIFO ending .fifo)."""
    return isinstance(name, str) and bool(_NAME.match(name) or _FIFO_NAME.match(name))


def is_fifo(name: str) -> bool:
    return name.endswith(FIFO_SUFFIX)


@dataclass(frozen=True)
class QueueId:
    """One SQS queue: its region, owning rayq account and SQS name."""

    region: str
    account: str
    name: str

    def rayq_name(self, home: str = HOME_REGION) -> str:
        """The rayq queue (in the owner's namespace) that holds this SQS queue."""
        stored = self.name + _ESCAPE if self.name.endswith(DLQ_SUFFIX) else self.name
        return stored if self.region == home else f"{self.region}.{stored}"

    def dead_letters(self) -> "QueueId":
        """The queue rayq's own dead-letter queue of this one shows as: ``<name>-dlq``."""
        return QueueId(self.region, self.account, self.name + DLQ_SUFFIX)

    def source(self) -> "QueueId | None":
        """The queue whose rayq dead-letter queue this one may be (``<name>-dlq``), if any."""
        if not self.name.endswith(DLQ_SUFFIX) or self.name == DLQ_SUFFIX:
            return None
        return QueueId(self.region, self.account, self.name[:-len(DLQ_SUFFIX)])

    def own_dead_letters_name(self, home: str = HOME_REGION) -> str | None:
        """The rayq name of rayq's own dead-letter queue this one may be, if any."""
        source = self.source()
        return None if source is None else source.rayq_name(home) + DLQ_SUFFIX

    def arn(self) -> str:
        return f"arn:aws:sqs:{self.region}:{account_id(self.account)}:{self.name}"

    def url(self, base: str) -> str:
        """The queue's URL under the endpoint's ``base`` (its scheme and host)."""
        return f"{base}/{account_id(self.account)}/{self.name}"


def from_rayq(account: str, rayq_name: str, region: str, home: str = HOME_REGION
              ) -> QueueId | None:
    """The SQS queue of ``region`` a rayq queue holds, or None when it holds none there
    (another region's, or a dead-letter queue rayq made for itself)."""
    if rayq_name.endswith(DLQ_SUFFIX):
        return None
    if rayq_name.endswith(DLQ_SUFFIX + _ESCAPE):
        rayq_name = rayq_name[:-len(_ESCAPE)]
    stored_region, _, name = rayq_name.partition(".")
    if not name or name == FIFO_SUFFIX[1:]:
        stored_region, name = home, rayq_name
    if stored_region != region:
        return None
    return QueueId(region, account, name) if valid_name(name) else None


def parse_arn(arn: object) -> tuple[str, str, str] | None:
    """(region, account id or name, queue name) of a queue ARN, or None."""
    match = _ARN.match(arn) if isinstance(arn, str) else None
    return match.groups() if match else None
