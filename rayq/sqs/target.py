"""One request's caller, its rayq client, and the queues it names (by QueueUrl, name
or ARN), resolved to the rayq queues that hold them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from rayq.core.auth.accounts import ADMIN
from rayq.errors import QueueNotFound
from rayq.queue import Queue
from rayq.sqs.errors import SqsError, invalid, missing, no_queue
from rayq.sqs.names import QueueId, account_id, is_account_id, parse_arn, valid_name
from rayq.sqs.sigv4 import Caller


class Target:
    """A request's account and region, its rayq client, and ``queue_id``: the queue its
    QueueUrl names (None without one). An account reaches its own queues only; the
    ``default`` account reaches every account's (the runtime's gates check it again)."""

    def __init__(self, caller: Caller, client, base: str, home: str,
                 accounts: Callable[[], Iterable[str]], url: Any = None):
        self.caller, self.client, self.base, self.home = caller, client, base, home
        self._accounts = accounts
        self.region = caller.region
        self.queue_id = self._from_url(url) if url is not None else None

    # -- naming -----------------------------------------------------------------------
    def _owner(self, segment: str) -> str:
        """The account a URL's or ARN's account part names (its id or, as before ids, its
        name). Raises QueueDoesNotExist for another account's unless the caller is the
        ``default`` account."""
        mine = self.caller.account
        if segment in (mine, account_id(mine)):
            return mine
        if mine == ADMIN:
            if not is_account_id(segment):
                return segment
            for account in self._accounts():
                if account_id(account) == segment:
                    return account
        raise no_queue()  # another account's queue: as if it did not exist

    def _from_url(self, url: Any) -> QueueId:
        if not isinstance(url, str):
            raise invalid("QueueUrl must be a string.")
        parts = urlsplit(url).path.strip("/").split("/")
        if len(parts) != 2 or not parts[0] or not valid_name(parts[1]):
            raise no_queue()  # SQS answers a malformed QueueUrl as a queue it does not have
        return QueueId(self.region, self._owner(parts[0]), parts[1])

    def named(self, name: str) -> QueueId:
        """The caller's queue ``name`` in the request's region."""
        return QueueId(self.region, self.caller.account, name)

    def from_arn(self, arn: Any) -> QueueId:
        """The queue an ARN names. Raises QueueDoesNotExist when it is not one of the
        caller's (or, for the ``default`` account, anyone's)."""
        parts = parse_arn(arn)
        if parts is None:
            raise no_queue()
        region, owner, name = parts
        return QueueId(region, self._owner(owner), name)

    def ref(self, queue: QueueId) -> str:
        """The rayq queue as the client names it (``owner/name`` for another account's).
        ``<name>-dlq`` is rayq's own dead-letter queue of ``<name>`` while ``<name>``
        dead-letters into it (``max_receives``) and no SQS queue ``<name>-dlq`` was made."""
        own = queue.own_dead_letters_name(self.home)
        if own is not None and self.redrives_to_own(queue.source()) is not None \
                and not self._routed(self._qualified(queue, queue.rayq_name(self.home))):
            return self._qualified(queue, own)
        return self._qualified(queue, queue.rayq_name(self.home))

    def _qualified(self, queue: QueueId, name: str) -> str:
        return name if queue.account == self.caller.account else f"{queue.account}/{name}"

    def _routed(self, ref: str):
        """The registry's record of the rayq queue ``ref`` (as the client keeps it), or None."""
        try:
            return self.client.transport.route(ref)[0]
        except QueueNotFound:
            return None

    def redrives_to_own(self, queue: QueueId) -> int | None:
        """rayq's ``max_receives`` of a queue made with it (so it dead-letters into rayq's
        own ``<name>-dlq``), or None (none set, or no such queue)."""
        info = self._routed(self.ref(queue))
        return None if info is None or info.is_dlq else info.max_receives

    def own_dead_letters(self, queue: QueueId) -> bool:
        """Whether ``queue`` (``<name>-dlq``) is rayq's own dead-letter queue of ``<name>``."""
        source = queue.source()
        return source is not None and self.ref(queue) == \
            self._qualified(queue, queue.own_dead_letters_name(self.home))

    def url(self, queue: QueueId | None = None) -> str:
        return (queue or self.need()).url(self.base)

    # -- reaching -------------------------------------------------------------------------
    def need(self) -> QueueId:
        """The QueueUrl's queue. Raises MissingParameter without one."""
        if self.queue_id is None:
            raise missing("QueueUrl")
        return self.queue_id

    def queue(self, queue: QueueId | None = None) -> Queue:
        return Queue(self.client.transport, self.ref(queue or self.need()))

    def info(self, queue: QueueId | None = None):
        """The registry's record of a queue (creation time). Raises QueueDoesNotExist.
        Read through the client's routing call: the public API has no accessor for it."""
        try:
            return self.client.transport.route(self.ref(queue or self.need()), refresh=True)[0]
        except QueueNotFound:
            raise no_queue() from None

    def ordered(self, queue: QueueId | None = None) -> bool:
        """Whether a queue is an ordered rayq queue (a FIFO queue keyed by its groups),
        read from the route the client keeps. Raises QueueNotFound."""
        return self.client.transport.route(self.ref(queue or self.need()))[0].ordered

    def exists(self, queue: QueueId) -> bool:
        try:
            self.info(queue)
            return True
        except SqsError as err:
            if err.code == "QueueDoesNotExist":
                return False
            raise
