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
from rayq.sqs.batches import check_entries, failure
from rayq.sqs.errors import (SqsError, bad_handle, from_rayq, invalid, missing, no_queue,
                             out_of_range)
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
    def forward(self, handle: str) -> str | None: ...
    def record(self, handle: str, receipt: str) -> None: ...
    def first_received(self, message_id: str, receive_count: int, now_ms: int) -> int: ...


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
        if method is None and action not in UNSUPPORTED:
            raise _unsupported(action)
        if not isinstance(params, dict):
            raise invalid("The request body must be a JSON object.")
        target = Target(caller, self.clients(caller), self._queue_name(params, caller), host)
        try:
            if method is None:  # SQS names a missing queue before anything else
                if target.name is not None:
                    _info(target.client, target.ref)
                raise _unsupported(action)
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
            raise no_queue()  # SQS answers a malformed QueueUrl as a queue it does not have
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
                raise SqsError("QueueNameExists", "A queue already exists with the same name "
                                                  "and a different value for attribute "
                                                  f"{_first_difference(base, change)}")
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
    def _outgoing(self, t: Target, entry: dict,
                  settings: attrs.Settings) -> tuple[Outgoing, msgs.Envelope]:
        """A SendMessage (or batch entry) as a rayq message, and its envelope. Raises
        SqsError."""
        attributes = msgs.check_attributes(entry.get("MessageAttributes"))
        system = msgs.check_attributes(entry.get("MessageSystemAttributes"), system=True)
        body = msgs.check_body(entry.get("MessageBody"), settings.max_message_bytes,
                               msgs.attributes_bytes(attributes))
        if entry.get("MessageDeduplicationId") is not None:
            raise invalid("The request include parameter that is not valid for this queue "
                          "type.")
        tenant, group = _group(entry.get("MessageGroupId"), t.caller.account)
        delay = _int(entry, "DelaySeconds", 0, MAX_DELAY_S, settings.delay_s)
        trace = system.get(msgs.TRACE_HEADER, {}).get("StringValue")
        envelope = msgs.Envelope(body, attributes, trace=trace, group=group)
        return Outgoing(envelope.stored(), tenant=tenant, type=msgs.message_type(attributes),
                        delay_s=delay, ttl_s=settings.retention_s), envelope

    @staticmethod
    def _sent(message_id: str, envelope: msgs.Envelope, system: Any) -> dict:
        sent = {"MessageId": message_id, "MD5OfMessageBody": msgs.md5_hex(envelope.body.encode())}
        if envelope.attributes:
            sent["MD5OfMessageAttributes"] = msgs.attributes_md5(envelope.attributes)
        if system:
            sent["MD5OfMessageSystemAttributes"] = msgs.attributes_md5(
                msgs.check_attributes(system, system=True))
        return sent

    def _send_message(self, t: Target, p: dict) -> dict:
        queue = _need_queue(t)
        out, envelope = self._outgoing(t, p, self.state.settings(t.owner, t.name))
        [message_id] = queue.send_batch([out])
        return self._sent(message_id, envelope, p.get("MessageSystemAttributes"))

    def _send_message_batch(self, t: Target, p: dict) -> dict:
        queue = _need_queue(t)
        entries = check_entries(p)
        settings = self.state.settings(t.owner, t.name)
        size = sum(len(str(e.get("MessageBody", "")).encode()) for e in entries)
        if size > MAX_BATCH_BYTES:
            raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                                                  f"{MAX_BATCH_BYTES} bytes. You have sent "
                                                  f"{size} bytes.")
        good, failed = [], []
        for entry in entries:
            try:
                good.append((entry, self._outgoing(t, entry, settings)))
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        ids = queue.send_batch([out for _, (out, _) in good]) if good else []
        done = [{"Id": e["Id"], **self._sent(mid, envelope, e.get("MessageSystemAttributes"))}
                for (e, (_, envelope)), mid in zip(good, ids)]
        return {"Successful": done, "Failed": failed}

    def _receive_message(self, t: Target, p: dict) -> dict:
        queue = _need_queue(t)
        settings = self.state.settings(t.owner, t.name)
        count = _int(p, "MaxNumberOfMessages", 1, MAX_RECEIVE, 1)
        hide_s = _int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_S, settings.visibility_timeout_s)
        wait_s = _int(p, "WaitTimeSeconds", 0, MAX_WAIT_S, settings.wait_s)
        system = msgs.check_system_names(p.get("MessageSystemAttributeNames",
                                               p.get("AttributeNames")))
        names = p.get("MessageAttributeNames")
        msgs.pick_attributes({}, names)  # checks the names before anything is received
        got = queue.receive(max_messages=count, visibility_timeout_s=hide_s, wait_s=wait_s)
        now_ms = int(self.clock() * 1000)
        return {"Messages": [self._message(t, m, system, names, now_ms) for m in got]} \
            if got else {}

    def _message(self, t: Target, m, system: list[str], names: Any, now_ms: int) -> dict:
        """A received message in SQS's shape, with the attributes the receive asked for."""
        envelope = msgs.opened(m.body)
        out = {"MessageId": m.id, "ReceiptHandle": m.receipt,
               "MD5OfBody": msgs.md5_hex(envelope.body.encode()), "Body": envelope.body}
        if system:
            first_ms = self.state.first_received(m.id, m.dequeue_count, now_ms)
            out["Attributes"] = msgs.system_attributes(m, envelope, system, first_ms,
                                                       sender=m.tenant)
        attributes = envelope.attributes or (
            msgs.type_attributes(m.type) if m.type != "default" else {})
        picked = msgs.pick_attributes(attributes, names)
        if picked:
            out["MessageAttributes"] = msgs.rendered(picked)
            out["MD5OfMessageAttributes"] = msgs.attributes_md5(picked)
        return out

    @staticmethod
    def _receipt(p: dict) -> str:
        handle = p.get("ReceiptHandle")
        if handle is None or handle == "":
            raise missing("ReceiptHandle")
        if not isinstance(handle, str):
            raise bad_handle(handle)
        return handle

    def _delete_message(self, t: Target, p: dict) -> dict:
        queue, handle = _need_queue(t), self._receipt(p)
        self._forwarded(handle, lambda receipt: queue.delete(receipt))
        return {}

    def _forwarded(self, handle: str, act: Callable[[str], Any]) -> Any:
        """``act(receipt)`` for a handle, or for the receipt ChangeMessageVisibility gave
        in its place when rayq refuses the handle itself."""
        try:
            return act(handle)
        except ReceiptInvalid:
            current = self.state.forward(handle)
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
        refused = self._delete_all(queue, list(handles.values()))
        for entry_id, handle in handles.items():
            if handle in refused:
                failed.append(failure(entry_id, from_rayq(refused[handle])))
        done = [{"Id": i} for i, h in handles.items() if h not in refused]
        return {"Successful": done, "Failed": failed}

    def _delete_all(self, queue: Queue, handles: list[str]) -> dict[str, ReceiptInvalid]:
        """Delete by handles in one batch (then once more for forwarded ones); returns the
        handles refused, each with its error."""
        if not handles:
            return {}
        try:
            queue.delete_batch(handles)
            return {}
        except ReceiptInvalid as err:
            refused = set(err.receipts)
        forwards = {h: self.state.forward(h) for h in handles if h in refused}
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
        receipt = self._forwarded(handle, lambda r: queue.change_visibility(r, timeout_s))
        self.state.record(handle, receipt)

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


def _first_difference(base: attrs.Settings, change: attrs.Change) -> str:
    """The SQS name of the first attribute a CreateQueue of an existing queue changes."""
    for name, (field, _, _) in attrs.SETTABLE.items():
        if getattr(base, field) != getattr(change.settings, field):
            return name
    return attrs.REDRIVE


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
        raise out_of_range(name, value, f"Must be between {low} and {high}, if provided.")
    return value


def _token(token: Any) -> str:
    if token is None:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, AttributeError, UnicodeError):
        raise invalid("Invalid NextToken value.") from None


def _group(group: Any, account: str) -> tuple[str | None, str | None]:
    """(rayq tenant, MessageGroupId to keep in the envelope) of a MessageGroupId. The
    ``default`` account sends as any tenant, so its group is the tenant; another account
    sends as itself, and a group other than its name travels in the envelope."""
    if group is None:
        return None, None
    if not isinstance(group, str) or not 1 <= len(group) <= 128 \
            or not re.fullmatch(r"[!-~]+", group):
        raise invalid(f"Value {group!s:.130} for parameter MessageGroupId is invalid. Reason: "
                      "MessageGroupId can only include alphanumeric and punctuation "
                      "characters. 1 to 128 in length.")
    if account == ADMIN or group == account:
        return group, None
    return None, group
