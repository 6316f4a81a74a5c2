"""The SQS operations, over one rayq Client per account.

:class:`SqsApi` takes an action name and its decoded JSON parameters from a
caller whose signature was verified, and returns the JSON response. Queue
URLs are ``http://HOST:PORT/ACCOUNT/QUEUE``; an account reaches its own
queues only (the runtime's gates check it again on every rayq request).
Settings rayq's registry does not keep (default visibility timeout, delay,
retention, wait time, size limit) come from a :class:`State`, which also
forwards receipt handles changed by ChangeMessageVisibility: rayq issues a new
receipt then, while SQS clients keep using the handle they received.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from rayq.core.auth.accounts import ADMIN
from rayq.core.codec.model import Outgoing
from rayq.errors import QueueNotFound, RayqError, ReceiptInvalid
from rayq.queue import Queue
from rayq.sqs import attributes as attrs
from rayq.sqs import messages as msgs
from rayq.sqs.admission import Parked
from rayq.sqs.batches import check_entries, failure
from rayq.sqs.errors import SqsError, from_rayq, invalid, missing, no_queue
from rayq.sqs.sigv4 import Caller

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
MAX_RECEIVE = 10
MAX_WAIT_S = 20
MAX_VISIBILITY_S = 43_200
MAX_DELAY_S = 900
MAX_BATCH_BYTES = 1_048_576  # SQS's limit on a batch's bodies together, whatever the queue's


class State(Protocol):
    def settings(self, account: str, queue: str) -> attrs.Settings: ...
    def save(self, account: str, queue: str, settings: attrs.Settings | None) -> None: ...
    def forward(self, owner: str, handle: str) -> str | None: ...
    def record(self, owner: str, handle: str, receipt: str) -> None: ...


class Target:
    """One request's account, its rayq client, and the queue its QueueUrl names: ``owner``
    and ``name`` from the URL, ``ref`` as the client names it (the ``default`` account
    reaches another account's queue as ``owner/name``)."""

    def __init__(self, caller: Caller, client, queue: tuple[str, str] | None, host: str):
        self.caller, self.client, self.host = caller, client, host
        self.owner, self.name = queue or (caller.account, None)
        self.ref = self.name if self.owner == caller.account else f"{self.owner}/{self.name}"
        self.queue = Queue(client.transport, self.ref) if self.name is not None else None

    def url(self, ref: str | None = None) -> str:
        """The URL of this target's queue, or of the caller's queue ``ref`` (as listed)."""
        if ref is None:
            return f"http://{self.host}/{self.owner}/{self.name}"
        return f"http://{self.host}/{ref if '/' in ref else self.caller.account + '/' + ref}"

    def arn(self) -> str:
        return attrs.arn(self.caller.region, self.owner, self.name)


class SqsApi:
    def __init__(self, clients: Callable[[Caller], Any], state: State,
                 clock: Callable[[], float] = time.time):
        self.clients, self.state, self.clock = clients, state, clock
        self._actions = {name: getattr(self, "_" + _snake(name)) for name in ACTIONS}

    def handle(self, action: str, params: Any, caller: Caller, host: str) -> dict:
        """The response of one action. Raises SqsError."""
        method = self._actions.get(action)
        if method is None:
            raise _unsupported(action)
        if not isinstance(params, dict):
            raise invalid("The request body must be a JSON object.")
        target = Target(caller, self.clients(caller), self._queue_name(params, caller), host)
        try:
            return method(target, params)
        except RayqError as err:
            raise from_rayq(err) from err

    @staticmethod
    def _queue_name(params: dict, caller: Caller) -> tuple[str, str] | None:
        """(owner, queue) a QueueUrl names. Raises QueueDoesNotExist for another account's
        queue unless the caller is the ``default`` account, which administers them all."""
        url = params.get("QueueUrl")
        if url is None:
            return None
        if not isinstance(url, str):
            raise invalid("QueueUrl must be a string.")
        parts = urlsplit(url).path.strip("/").split("/")
        if len(parts) != 2 or not _QUEUE_NAME.match(parts[1]) or not parts[0]:
            raise SqsError("InvalidAddress", f"The address {url} is not valid for this endpoint.")
        if parts[0] != caller.account and caller.account != ADMIN:
            raise no_queue()  # another account's queue: as if it did not exist
        return parts[0], parts[1]

    # -- queues ---------------------------------------------------------------
    def _create_queue(self, t: Target, p: dict) -> dict:
        name = _queue_name_param(p)
        if p.get("tags"):
            raise invalid("Queue tags are not supported by rayq.")
        if name.endswith("-dlq"):  # rayq makes each queue's dead-letter queue with it
            _info(t.client, name)
            return {"QueueUrl": t.url(name)}
        try:
            info = _info(t.client, name)
        except QueueNotFound:
            info = None
        now = self.clock()
        base = self.state.settings(t.owner, name) if info else attrs.Settings()
        change = attrs.parse(p.get("Attributes"), base, t.owner, name, now)
        if info is not None:
            same = dataclasses.replace(change.settings, modified_at=base.modified_at) == base
            if not same or change.max_receives not in (None, info.max_receives or 0):
                raise SqsError("QueueNameExists", f"A queue named {name} already exists with "
                                                  "different attributes.")
            return {"QueueUrl": t.url(name)}
        t.client.create_queue(name, max_receives=change.max_receives or None)
        self.state.save(t.owner, name, dataclasses.replace(change.settings, modified_at=now))
        return {"QueueUrl": t.url(name)}

    def _get_queue_url(self, t: Target, p: dict) -> dict:
        name = _queue_name_param(p)
        owner = p.get("QueueOwnerAWSAccountId")
        if owner not in (None, t.caller.account):
            raise no_queue()
        _info(t.client, name)
        return {"QueueUrl": t.url(name)}

    def _list_queues(self, t: Target, p: dict) -> dict:
        prefix = p.get("QueueNamePrefix", "")
        if not isinstance(prefix, str):
            raise invalid("QueueNamePrefix must be a string.")
        limit = _int(p, "MaxResults", 1, 1000, None)
        after = _token(p.get("NextToken"))
        names = [n for n in sorted(t.client.list_queues())
                 if n.rpartition("/")[2].startswith(prefix) and n > after]
        out: dict[str, Any] = {"QueueUrls": [t.url(n) for n in names[:limit or 1000]]}
        if limit is not None and len(names) > limit:
            out["NextToken"] = base64.urlsafe_b64encode(names[limit - 1].encode()).decode()
        return out

    def _delete_queue(self, t: Target, p: dict) -> dict:
        _need_queue(t)
        t.client.delete_queue(t.ref)
        self.state.save(t.owner, t.name, None)
        return {}

    def _purge_queue(self, t: Target, p: dict) -> dict:
        _need_queue(t).clear()
        return {}

    def _get_queue_attributes(self, t: Target, p: dict) -> dict:
        names = attrs.check_names(p.get("AttributeNames"))
        _need_queue(t)
        info = _info(t.client, t.ref)
        settings = self.state.settings(t.owner, t.name)
        values = settings.render()
        values.update(CreatedTimestamp=str(int(info.created_at)),
                      LastModifiedTimestamp=str(int(settings.modified_at or info.created_at)),
                      QueueArn=t.arn())
        if info.max_receives:
            values[attrs.REDRIVE] = attrs.redrive_policy(t.caller.region, t.owner, t.name,
                                                         info.max_receives)
        if any(n in attrs.COUNTS for n in names):
            values.update(zip(attrs.COUNTS, map(str, t.queue.counts_by_visibility())))
        picked = {n: values[n] for n in names if n in values}
        return {"Attributes": picked} if picked else {}

    def _set_queue_attributes(self, t: Target, p: dict) -> dict:
        if "Attributes" not in p:
            raise missing("Attributes")
        _need_queue(t)
        info = _info(t.client, t.ref)
        base = self.state.settings(t.owner, t.name)
        change = attrs.parse(p["Attributes"], base, t.owner, t.name, self.clock())
        if change.max_receives is not None and change.max_receives != (info.max_receives or 0):
            raise invalid("rayq sets a queue's RedrivePolicy (maxReceiveCount) when the queue is "
                          f"created; {t.name} has maxReceiveCount {info.max_receives or 'none'}.")
        self.state.save(t.owner, t.name, change.settings)
        return {}

    # -- messages -------------------------------------------------------------------
    def _outgoing(self, t: Target, entry: dict, settings: attrs.Settings) -> Outgoing:
        """A SendMessage (or batch entry) as a rayq message. Raises SqsError."""
        body = msgs.check_body(entry.get("MessageBody"), settings.max_message_bytes)
        for name in ("MessageDeduplicationId", "MessageSystemAttributes"):
            if entry.get(name) is not None:
                raise invalid(f"{name} is not supported on rayq's (standard) queues.")
        tenant = entry.get("MessageGroupId")
        if tenant is not None:
            _check_group(tenant, t.caller.account)
        delay = _int(entry, "DelaySeconds", 0, MAX_DELAY_S, settings.delay_s)
        return Outgoing(body, tenant=tenant, type=msgs.message_type(entry.get("MessageAttributes")),
                        delay_s=delay, ttl_s=settings.retention_s)

    @staticmethod
    def _sent(message_id: str, out: Outgoing, attributes: Any) -> dict:
        sent = {"MessageId": message_id, "MD5OfMessageBody": msgs.md5_hex(out.body.encode())}
        if attributes:
            sent["MD5OfMessageAttributes"] = msgs.attributes_md5(attributes)
        return sent

    def _send_message(self, t: Target, p: dict) -> dict:
        queue = _need_queue(t)
        out = self._outgoing(t, p, self.state.settings(t.owner, t.name))
        [message_id] = queue.send_batch([out])
        return self._sent(message_id, out, p.get("MessageAttributes"))

    def _send_message_batch(self, t: Target, p: dict) -> dict:
        queue = _need_queue(t)
        entries = check_entries(p)
        settings = self.state.settings(t.owner, t.name)
        size = sum(len(str(e.get("MessageBody", "")).encode()) for e in entries)
        if size > MAX_BATCH_BYTES:
            raise SqsError("BatchRequestTooLong", f"Batch requests must be at most "
                                                  f"{MAX_BATCH_BYTES} bytes in total.")
        good, failed = [], []
        for entry in entries:
            try:
                good.append((entry, self._outgoing(t, entry, settings)))
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        ids = queue.send_batch([out for _, out in good]) if good else []
        done = [{"Id": e["Id"], **self._sent(mid, out, e.get("MessageAttributes"))}
                for (e, out), mid in zip(good, ids)]
        return {"Successful": done, "Failed": failed}

    def _receive_message(self, t: Target, p: dict) -> dict:
        queue = _need_queue(t)
        settings = self.state.settings(t.owner, t.name)
        count = _int(p, "MaxNumberOfMessages", 1, MAX_RECEIVE, 1)
        hide_s = _int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_S, settings.visibility_timeout_s)
        wait_s = _int(p, "WaitTimeSeconds", 0, MAX_WAIT_S, settings.wait_s)
        system = msgs.check_system_names(p.get("MessageSystemAttributeNames",
                                               p.get("AttributeNames")))
        with_type = msgs.wants_type(p.get("MessageAttributeNames"))
        def answer(got: list) -> dict:
            return {"Messages": [_message(m, system, with_type) for m in got]} if got else {}
        if wait_s:  # the endpoint awaits it on its event loop: no thread waits while it parks
            return Parked(queue.receive_async(max_messages=count, visibility_timeout_s=hide_s,
                                              wait_s=wait_s), answer)
        return answer(queue.receive(max_messages=count, visibility_timeout_s=hide_s))

    @staticmethod
    def _receipt(p: dict) -> str:
        handle = p.get("ReceiptHandle")
        if handle is None or handle == "":
            raise missing("ReceiptHandle")
        if not isinstance(handle, str):
            raise SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
        return handle

    def _delete_message(self, t: Target, p: dict) -> dict:
        queue, handle = _need_queue(t), self._receipt(p)
        self._forwarded(t.owner, handle, lambda receipt: queue.delete(receipt))
        return {}

    def _forwarded(self, owner: str, handle: str, act: Callable[[str], Any]) -> Any:
        """``act(receipt)`` for a handle, or for the receipt ChangeMessageVisibility gave
        in its place (on a queue of ``owner``) when rayq refuses the handle itself."""
        try:
            return act(handle)
        except ReceiptInvalid:
            current = self.state.forward(owner, handle)
            if current is None:
                raise
            return act(current)

    def _delete_message_batch(self, t: Target, p: dict) -> dict:
        queue, entries = _need_queue(t), check_entries(p)
        handles, failed = {}, []
        for entry in entries:
            try:
                handles[entry["Id"]] = self._receipt(entry)
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        refused = self._delete_all(t.owner, queue, list(handles.values()))
        for entry_id, handle in handles.items():
            if handle in refused:
                failed.append(failure(entry_id, from_rayq(refused[handle])))
        done = [{"Id": i} for i, h in handles.items() if h not in refused]
        return {"Successful": done, "Failed": failed}

    def _delete_all(self, owner: str, queue: Queue, handles: list[str]
                    ) -> dict[str, ReceiptInvalid]:
        """Delete by handles in one batch (then once more for forwarded ones); returns the
        handles refused, each with its error."""
        if not handles:
            return {}
        try:
            queue.delete_batch(handles)
            return {}
        except ReceiptInvalid as err:
            refused = set(err.receipts)
        forwards = {h: self.state.forward(owner, h) for h in handles if h in refused}
        retry = {current: h for h, current in forwards.items() if current is not None}
        if retry:
            try:
                queue.delete_batch(list(retry))
                refused -= set(retry.values())
            except ReceiptInvalid as err:
                refused -= {h for current, h in retry.items() if current not in err.receipts}
        return {h: ReceiptInvalid("the receipt handle is stale or invalid") for h in refused}

    def _change_message_visibility(self, t: Target, p: dict) -> dict:
        self._change(t, p)
        return {}

    def _change(self, t: Target, p: dict) -> None:
        queue, handle = _need_queue(t), self._receipt(p)
        if "VisibilityTimeout" not in p:
            raise missing("VisibilityTimeout")
        timeout_s = _int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_S, None)
        receipt = self._forwarded(t.owner, handle,
                                  lambda r: queue.change_visibility(r, timeout_s))
        self.state.record(t.owner, handle, receipt)

    def _change_message_visibility_batch(self, t: Target, p: dict) -> dict:
        _need_queue(t)
        done, failed = [], []
        for entry in check_entries(p):  # rayq changes visibility one receipt at a time
            try:
                try:
                    self._change(t, entry)
                except RayqError as err:
                    raise from_rayq(err) from err
                done.append({"Id": entry["Id"]})
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        return {"Successful": done, "Failed": failed}


ACTIONS = ("CreateQueue", "GetQueueUrl", "ListQueues", "DeleteQueue", "PurgeQueue",
           "GetQueueAttributes", "SetQueueAttributes", "SendMessage", "SendMessageBatch",
           "ReceiveMessage", "DeleteMessage", "DeleteMessageBatch", "ChangeMessageVisibility",
           "ChangeMessageVisibilityBatch")
UNSUPPORTED = ("AddPermission", "RemovePermission", "TagQueue", "UntagQueue", "ListQueueTags",
               "ListDeadLetterSourceQueues", "StartMessageMoveTask", "CancelMessageMoveTask",
               "ListMessageMoveTasks")


def _unsupported(action: str) -> SqsError:
    if action in UNSUPPORTED:
        return SqsError("UnsupportedOperation", f"rayq does not support the SQS action {action}.")
    return SqsError("InvalidAction", f"The action {action!r:.80} is not valid for this endpoint.")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _need_queue(t: Target) -> Queue:
    if t.queue is None:
        raise missing("QueueUrl")
    return t.queue


def _info(client, name: str):
    """The registry's record of a queue (creation time, max_receives). Raises QueueNotFound.
    Read through the client's routing call: the public API has no accessor for it yet."""
    return client.transport.route(name, refresh=True)[0]


def _queue_name_param(p: dict) -> str:
    name = p.get("QueueName")
    if name is None:
        raise missing("QueueName")
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        if isinstance(name, str) and name.endswith(".fifo"):
            raise invalid("FIFO queues are not supported by rayq.")
        raise invalid("Can only include alphanumeric characters, hyphens, or underscores. "
                      "1 to 80 in length")
    return name


def _int(p: dict, name: str, low: int, high: int, default: int | None) -> int | None:
    value = p.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"Value {value!r:.40} for parameter {name} is invalid. Reason: must be "
                      f"between {low} and {high}.")
    return value


def _token(token: Any) -> str:
    if token is None:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, AttributeError, UnicodeError):
        raise invalid("Invalid NextToken value.") from None


def _check_group(group: Any, account: str) -> None:
    """MessageGroupId is the rayq tenant; an account other than the admin sends only as
    itself (the runtime refuses a message sent as another tenant)."""
    if not isinstance(group, str) or not 1 <= len(group) <= 128 or not group.isprintable():
        raise invalid("MessageGroupId must be 1 to 128 printable characters.")
    if account != ADMIN and group != account:
        raise invalid(f"MessageGroupId is the rayq tenant, and account {account!r} sends only "
                      f"as tenant {account!r}; got {group!r}.")


def _message(m, system: list[str], with_type: bool) -> dict:
    body = msgs.body_text(m.body)
    out = {"MessageId": m.id, "ReceiptHandle": m.receipt, "MD5OfBody": msgs.md5_hex(body.encode()),
           "Body": body}
    if system:
        out["Attributes"] = msgs.system_attributes(m, system)
    if with_type:
        attributes = msgs.type_attributes(m.type)
        out["MessageAttributes"] = attributes
        out["MD5OfMessageAttributes"] = msgs.attributes_md5(attributes)
    return out
