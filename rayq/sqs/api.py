"""The SQS operations, over one rayq Client per account.

:class:`SqsApi` takes an action name and its decoded parameters from a caller whose
signature was verified, and returns the response. Queue URLs are
``http://HOST:PORT/ACCOUNT-ID/QUEUE`` (:mod:`rayq.sqs.names`); an account reaches its
own queues only (the runtime's gates check it again on every rayq request). The
queue actions live in :mod:`rayq.sqs.queues`, the message actions here. Settings
rayq's registry does not keep come from a :class:`State`, which also forwards
receipt handles changed by ChangeMessageVisibility: rayq issues a new receipt then,
while SQS clients keep using the handle they received.

A receipt handle is rayq's receipt followed by the message id, so an older handle of
a message still finds it: a delete with it deletes the message as last received
(through this replica), and one whose message is gone succeeds, as in SQS.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, replace
from collections.abc import Awaitable, Callable, Iterable, Iterator
from functools import partial
from typing import Any, Protocol

from rayq.core.auth.accounts import ADMIN
from rayq.core.codec.model import RECEIPT_CHARS, Outgoing, receipt_subqueue
from rayq.errors import RayqError, ReceiptInvalid
from rayq.queue import Queue
from rayq.remote import NO_WAITING, WouldBlock
from rayq.sqs import attributes as attrs
from rayq.sqs import fifo
from rayq.sqs import messages as msgs
from rayq.sqs import moves, queues
from rayq.sqs.admission import Parked
from rayq.sqs.batches import check_entries, failure
from rayq.sqs.errors import (SqsError, bad_handle, from_rayq, int_param, invalid, missing,
                              out_of_range)
from rayq.sqs.names import HOME_REGION
from rayq.sqs.sigv4 import Caller
from rayq.sqs.target import Target

MAX_RECEIVE = 10
MAX_WAIT_S = 20
MAX_VISIBILITY_S = 43_200
MAX_DELAY_S = 900
MAX_BATCH_BYTES = 1_048_576  # SQS's limit on a batch's bodies together, whatever the queue's
FIFO_WAIT_S = 10.0   # a FIFO send waits this long at most for another send of its id
FIFO_POLL_S = 0.02   # and asks again this often


class State(Protocol):
    def settings(self, account: str, queue: str) -> attrs.Settings: ...
    def save(self, account: str, queue: str, settings: attrs.Settings | None) -> None: ...
    def forward(self, owner: str, handle: str) -> str | None: ...
    def record(self, owner: str, handle: str, receipt: str) -> None: ...
    def latest(self, owner: str, message_id: str, receipt: str | None = None) -> str | None: ...
    def fifo_admit(self, account: str, queue: str, keys: list[str],
                   now: float) -> list[fifo.Admitted]: ...
    def fifo_record(self, account: str, queue: str, sent: list[tuple[str, str, str]],
                    now: float) -> None: ...
    def fifo_release(self, account: str, queue: str, keys: list[str]) -> None: ...
    def move_start(self, task: moves.MoveTask) -> bool: ...
    def move_list(self, source_arn: str) -> list[moves.MoveTask]: ...
    def move_cancel(self, handle: str) -> moves.MoveTask | None: ...


@dataclass(frozen=True)
class Draft:
    """A checked send: the envelope and rayq attributes of the message to store, the
    deduplication scope key (FIFO queues) and the system attributes it was sent with."""

    envelope: msgs.Envelope
    tenant: str | None
    type: str
    delay_s: int
    ttl_s: float
    key: str | None
    system: dict
    group: str | None = None  # MessageGroupId: an ordered (FIFO) queue's fairness key

    def sequenced(self, sequence: str) -> "Draft":
        return replace(self, envelope=self.envelope.moved(sequence=sequence))

    def outgoing(self, ordered: bool = False) -> Outgoing:
        """The message to store, keyed for fairness by its group: on an ordered (FIFO)
        queue its MessageGroupId; on a standard queue the group kept in its envelope (an
        account's own group: a message without one, or grouped by the account's name,
        takes the runtime's key, as does the ``default`` account's, whose group is the
        tenant)."""
        return Outgoing(self.envelope.stored(), tenant=self.tenant, type=self.type,
                        delay_s=self.delay_s, ttl_s=self.ttl_s,
                        key=self.group if ordered else self.envelope.group)

    def answer(self, message_id: str, sequence: str | None = None) -> dict:
        """SendMessage's answer: the id, the MD5s SDKs check, a FIFO's sequence number."""
        envelope = self.envelope
        sent = {"MessageId": message_id, "MD5OfMessageBody": msgs.md5_hex(envelope.body.encode())}
        if envelope.attributes:
            sent["MD5OfMessageAttributes"] = msgs.attributes_md5(envelope.attributes)
        if self.system:
            sent["MD5OfMessageSystemAttributes"] = msgs.attributes_md5(self.system)
        if sequence is not None:
            sent["SequenceNumber"] = sequence
        return sent


class SqsApi:
    def __init__(self, clients: Callable[[Caller], Any], state: State,
                 clock: Callable[[], float] = time.time,
                 accounts: Callable[[], Iterable[str]] = tuple, home_region: str = HOME_REGION):
        self.clients, self.state, self.clock = clients, state, clock
        self.accounts, self.home = accounts, home_region
        self._actions = {name: partial(action, self)
                         for name, action in {**queues.ACTIONS, **moves.ACTIONS}.items()}
        self._actions.update({name: getattr(self, "_" + _snake(name)) for name in MESSAGE_ACTIONS})

    async def answer(self, action: str, params: Any, caller: Caller, base: str,
                     in_thread: Callable[..., Awaitable], on_loop: bool) -> dict:
        """The action's answer, awaited on the endpoint's event loop. A message action
        begins there (with ``on_loop``); any other, or one that would wait there for more
        than its shard, runs ``in_thread``. A shard's part comes back :class:`Parked` and
        is awaited here, so no thread waits for it (a parked long poll holds one of the
        account's admitted requests and no thread); what follows runs here too unless it
        calls out again."""
        answer = self.on_loop(action, params, caller, base) if on_loop else None
        if answer is None:
            answer = await in_thread(self.handle, action, params, caller, base)
        if not isinstance(answer, Parked):
            return answer
        got = await answer.result()
        if answer.quick(got):
            return answer.finish(got)
        return await in_thread(answer.finish, got)

    def on_loop(self, action: str, params: Any, caller: Caller, base: str) -> dict | Parked | None:
        """:meth:`handle` of a message action, run on the replica's event loop: its answer,
        or the shard's part of it Parked; None when it would wait for anything else first
        (it then runs on a worker thread, from the start)."""
        if action not in ON_LOOP_ACTIONS:
            return None
        running = NO_WAITING.set(True)
        try:
            return self.handle(action, params, caller, base)
        except WouldBlock:
            return None
        finally:
            NO_WAITING.reset(running)

    def handle(self, action: str, params: Any, caller: Caller, base: str) -> dict:
        """The response of one action; ``base`` is the endpoint's scheme and host, as the
        request reached it (queue URLs are made under it). Raises SqsError."""
        method = self._actions.get(action)
        if method is None:
            raise _unsupported(action)
        if not isinstance(params, dict):
            raise invalid("The request body must be a JSON object.")
        try:
            target = Target(caller, self.clients(caller), base, self.home, self.accounts,
                            params.get("QueueUrl"))
            return method(target, params)
        except RayqError as err:
            raise from_rayq(err) from err

    def home_shard(self, action: str, params: Any, caller: Caller, base: str) -> int | None:
        """The one shard whose subqueues hold the queue a message action names (None: not a
        message action, no such queue, or its subqueues are spread over shards)."""
        if action not in MESSAGE_ACTIONS or not isinstance(params, dict):
            return None
        try:
            target = Target(caller, self.clients(caller), base, self.home, self.accounts,
                            params.get("QueueUrl"))
            info = target.client.transport.route(target.ref(target.need()))[0]
        except (RayqError, SqsError):
            return None
        shards = {subqueue.shard for subqueue in info.subqueues}
        return shards.pop() if len(shards) == 1 else None

    # -- sending ----------------------------------------------------------------------
    def _draft(self, t: Target, entry: dict, settings: attrs.Settings) -> Draft:
        """A SendMessage (or batch entry), checked. Raises SqsError."""
        attributes = msgs.check_attributes(entry.get("MessageAttributes"))
        system = msgs.check_attributes(entry.get("MessageSystemAttributes"), system=True)
        body = msgs.check_body(entry.get("MessageBody"), settings.max_message_bytes,
                               msgs.attributes_bytes(attributes))
        dedup = None
        if settings.fifo:
            fifo.check_send(entry)
            dedup = fifo.dedup_id(entry, body, settings.text(attrs.CONTENT_DEDUP) == "true")
        elif entry.get("MessageDeduplicationId") is not None:
            raise out_of_range("MessageDeduplicationId", entry["MessageDeduplicationId"],
                               "The request include parameter that is not valid for this "
                               "queue type.")
        group = entry.get("MessageGroupId")
        tenant, kept_group = _group(group, t.caller.account)
        delay = int_param(entry, "DelaySeconds", 0, MAX_DELAY_S, settings.delay_s)
        trace = system.get(msgs.TRACE_HEADER, {}).get("StringValue")
        envelope = msgs.Envelope(body, attributes, trace=trace, group=kept_group, dedup=dedup)
        key = fifo.scope_key(dedup, group, settings.text("DeduplicationScope") ==
                             "messageGroup") if dedup is not None else None
        return Draft(envelope, tenant, msgs.message_type(attributes), delay,
                     self._ttl_s(t, settings), key, system, group)

    @staticmethod
    def _ttl_s(t: Target, settings: attrs.Settings) -> float:
        """MessageRetentionPeriod, within the longest time to live the runtime keeps."""
        return min(settings.retention_s, t.client.transport.config.store.max_ttl_s)

    def _send(self, t: Target, drafts: list[Draft], fifo_queue: bool) -> list[dict]:
        """Store the drafts (in one batch); SendMessage's answer for each. On a FIFO queue,
        a draft whose deduplication id was sent within 5 minutes is not stored again: its
        answer names the message first sent."""
        if not fifo_queue:  # the put is awaited on the replica's event loop
            return Parked(t.queue().send_batch_async([d.outgoing() for d in drafts]),
                          lambda ids: [d.answer(mid) for d, mid in zip(drafts, ids)], _always)
        queue = t.need()
        name, now = queue.rayq_name(t.home), self.clock()
        admitted = self._admit(queue.account, name, [d.key for d in drafts], now)
        fresh = [(d.sequenced(a.sequence), a) for d, a in zip(drafts, admitted)
                 if a.duplicate_of is None]
        ordered = t.ordered()
        try:
            ids = t.queue().send_batch([d.outgoing(ordered) for d, _ in fresh]) if fresh else []
        except BaseException:  # nothing stored: a retry of these ids must not wait on us
            self.state.fifo_release(queue.account, name, [d.key for d, _ in fresh])
            raise
        sent = {d.key: mid for (d, _), mid in zip(fresh, ids)}
        self.state.fifo_record(queue.account, name,
                               [(d.key, mid, d.envelope.sequence) for (d, _), mid in
                                zip(fresh, ids)], now)
        return [d.answer(a.duplicate_of or sent[d.key], a.sequence)
                for d, a in zip(drafts, admitted)]

    def _admit(self, account: str, name: str, keys: list[str], now: float) -> list[fifo.Admitted]:
        """:meth:`State.fifo_admit`, asked again for the keys another send holds until that
        send stored (or gave up) its message. Raises ServiceUnavailable (SDKs retry it) if
        one is still held after FIFO_WAIT_S."""
        admitted = self.state.fifo_admit(account, name, keys, now)
        deadline = time.monotonic() + FIFO_WAIT_S
        while any(a.waiting for a in admitted):
            if time.monotonic() > deadline:
                raise SqsError("ServiceUnavailable", "A send of the same deduplication id is "
                               "still in progress; retry.", status=503, sender=False)
            time.sleep(FIFO_POLL_S)
            held = [i for i, a in enumerate(admitted) if a.waiting]
            again = self.state.fifo_admit(account, name, [keys[i] for i in held], self.clock())
            for i, answer in zip(held, again):
                admitted[i] = answer
        return admitted

    def _send_message(self, t: Target, p: dict) -> dict:
        t.need()
        settings = queues.settings_of(self, t)
        return _then(self._send(t, [self._draft(t, p, settings)], settings.fifo),
                     lambda answers: answers[0])

    def _send_message_batch(self, t: Target, p: dict) -> dict:
        t.need()
        entries = check_entries(p)
        settings = queues.settings_of(self, t)
        size = sum(len(str(e.get("MessageBody", "")).encode()) for e in entries)
        if size > MAX_BATCH_BYTES:
            raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                                                  f"{MAX_BATCH_BYTES} bytes. You have sent "
                                                  f"{size} bytes.")
        good, failed = [], []
        for entry in entries:
            try:
                good.append((entry["Id"], self._draft(t, entry, settings)))
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        def answered(answers: list[dict]) -> dict:
            done = [{"Id": entry_id, **answer} for (entry_id, _), answer in zip(good, answers)]
            return {"Successful": done, "Failed": failed}
        return _then(self._send(t, [d for _, d in good], settings.fifo), answered) if good \
            else answered([])

    # -- receiving --------------------------------------------------------------------------
    def _receive_message(self, t: Target, p: dict) -> dict:
        t.need()
        settings = queues.settings_of(self, t)
        count = int_param(p, "MaxNumberOfMessages", 1, MAX_RECEIVE, 1)
        hide_s = int_param(p, "VisibilityTimeout", 0, MAX_VISIBILITY_S, settings.visibility_timeout_s)
        wait_s = int_param(p, "WaitTimeSeconds", 0, MAX_WAIT_S, settings.wait_s)
        system = msgs.check_system_names(p.get("MessageSystemAttributeNames",
                                               p.get("AttributeNames")))
        names = p.get("MessageAttributeNames")
        msgs.pick_attributes({}, names)  # checks the names before anything is received
        queue = t.queue()
        redrive = attrs.redrive_target(settings)

        def answer(got: list) -> dict:
            if redrive is not None and got:
                got = self._dead_letter(t, queue, got, *redrive)
            return {"Messages": [self._message(t, m, system, names) for m in got]} \
                if got else {}
        # awaited on the replica's event loop: no thread waits while a long poll parks
        return Parked(queue.receive_async(max_messages=count, visibility_timeout_s=hide_s,
                                          wait_s=wait_s), answer,
                      quick=lambda got: redrive is None)  # dead letters are sent on

    def _dead_letter(self, t: Target, queue: Queue, got: list, target_arn: str,
                     max_receives: int) -> list:
        """Move the received messages past ``max_receives`` to the dead-letter queue (as SQS
        does on the receive that exceeds it); returns the others."""
        dead = [m for m in got if m.dequeue_count > max_receives]
        if not dead:
            return got
        source = t.need().arn()
        moved = []
        try:
            dead_queue = t.from_arn(target_arn)
            ordered = t.ordered(dead_queue)
            for m in dead:
                envelope = msgs.opened(m.body)
                moved.append(Outgoing(envelope.moved(
                    source=source, sent_ms=envelope.sent_ms or int(m.enqueued_at * 1000)).stored(),
                    tenant=m.tenant if t.caller.account == ADMIN else None, type=m.type,
                    key=msgs.key_in(ordered, m, envelope)))
            t.queue(dead_queue).send_batch(moved)
        except (RayqError, SqsError):  # the dead-letter queue is gone: deliver them instead
            return got
        queue.delete_batch([m.receipt for m in dead])
        return [m for m in got if m.dequeue_count <= max_receives]

    def _message(self, t: Target, m, system: list[str], names: Any) -> dict:
        """A received message in SQS's shape, with the attributes the receive asked for."""
        envelope = msgs.opened(m.body)
        self.state.latest(t.need().account, m.id, m.receipt)
        out = {"MessageId": m.id, "ReceiptHandle": m.receipt + m.id,
               "MD5OfBody": msgs.md5_hex(envelope.body.encode()), "Body": envelope.body}
        if system:
            out["Attributes"] = msgs.system_attributes(m, envelope, system, sender=m.tenant)
        attributes = envelope.attributes or (
            msgs.type_attributes(m.type) if m.type != "default" else {})
        picked = msgs.pick_attributes(attributes, names)
        if picked:
            out["MessageAttributes"] = msgs.rendered(picked)
            out["MD5OfMessageAttributes"] = msgs.attributes_md5(picked)
        return out

    # -- receipts ---------------------------------------------------------------------------
    @staticmethod
    def _receipt(p: dict) -> tuple[str, str | None]:
        """(rayq receipt, message id or None) of a ReceiptHandle. Raises MissingParameter or
        ReceiptHandleIsInvalid when it is not shaped like one."""
        handle = p.get("ReceiptHandle")
        if handle is None or handle == "":
            raise missing("ReceiptHandle")
        try:
            receipt_subqueue(handle[:RECEIPT_CHARS] if isinstance(handle, str) else handle)
            bytes.fromhex(handle[:RECEIPT_CHARS])
        except (ReceiptInvalid, ValueError):
            raise bad_handle(handle) from None
        return handle[:RECEIPT_CHARS], handle[RECEIPT_CHARS:] or None

    def _candidates(self, owner: str, receipt: str, message_id: str | None) -> Iterator[str]:
        """The rayq receipts a handle (on a queue of ``owner``) may stand for, most likely
        first: its own, the one ChangeMessageVisibility gave in its place, the message's
        latest receive. Lazily: the others are looked up (the forward may ask the state
        actor) only when the handle's own receipt was refused."""
        yield receipt
        seen = {receipt}
        for look_up in (lambda: self.state.forward(owner, receipt),
                        lambda: self.state.latest(owner, message_id) if message_id else None):
            other = look_up()
            if other is not None and other not in seen:
                seen.add(other)
                yield other

    def _delete_message(self, t: Target, p: dict) -> dict:
        t.need()
        return self._delete_all(t, [self._receipt(p)]).followed(lambda _: {})

    def _delete_message_batch(self, t: Target, p: dict) -> dict:
        t.need()
        entries = check_entries(p, "DeleteMessageBatch")
        handles, failed = {}, []
        for entry in entries:
            try:
                handles[entry["Id"]] = self._receipt(entry)
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        answer = {"Successful": [{"Id": i} for i in handles], "Failed": failed}
        return self._delete_all(t, list(handles.values())).followed(lambda _: answer) \
            if handles else answer

    def _delete_all(self, t: Target, handles: list[tuple[str, str | None]]) -> Parked:
        """Delete by handles in one batch (awaited on the replica's event loop), then, for
        the handles refused, once more through the receipts their messages were given
        since. A handle whose message is gone (deleted, or received again through another
        replica) is a success, as in SQS."""
        queue, owner = t.queue(), t.need().account

        def again(refused: set[str]) -> None:
            retry = [c for receipt, mid in handles if receipt in refused
                     for c in itertools.islice(self._candidates(owner, receipt, mid), 1, None)]
            if retry:
                try:
                    queue.delete_batch(retry)
                except ReceiptInvalid:
                    pass  # those messages are gone, or another receive holds them
        return Parked(_refused(queue.delete_batch_async([r for r, _ in handles])), again,
                      quick=lambda refused: not refused)

    def _change_message_visibility(self, t: Target, p: dict) -> dict:
        self._change(t, p)
        return {}

    def _change(self, t: Target, p: dict) -> None:
        t.need()
        receipt, message_id = self._receipt(p)
        if "VisibilityTimeout" not in p:
            raise missing("VisibilityTimeout")
        value = p["VisibilityTimeout"]
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 0 <= value <= MAX_VISIBILITY_S:
            raise out_of_range("VisibilityTimeout", value, "Total VisibilityTimeout for the "
                               f"message is beyond the limit [{MAX_VISIBILITY_S} seconds]")
        queue, owner = t.queue(), t.need().account
        for candidate in self._candidates(owner, receipt, message_id):
            try:
                new = queue.change_visibility(candidate, value)
            except ReceiptInvalid:
                continue
            self.state.record(owner, receipt, new)
            if message_id:
                self.state.latest(owner, message_id, new)
            return
        raise out_of_range("ReceiptHandle", p["ReceiptHandle"], "Message does not exist or is "
                           "not available for visibility timeout change.")

    def _change_message_visibility_batch(self, t: Target, p: dict) -> dict:
        t.need()
        done, failed = [], []
        for entry in check_entries(p, "ChangeMessageVisibilityBatch"):
            try:
                try:
                    self._change(t, entry)
                except RayqError as err:
                    raise from_rayq(err) from err
                done.append({"Id": entry["Id"]})
            except SqsError as err:
                failed.append(failure(entry["Id"], err))
        return {"Successful": done, "Failed": failed}


MESSAGE_ACTIONS = ("SendMessage", "SendMessageBatch", "ReceiveMessage", "DeleteMessage",
                   "DeleteMessageBatch", "ChangeMessageVisibility",
                   "ChangeMessageVisibilityBatch")
# Begun on the replica's event loop (SqsApi.on_loop): each makes its shard call awaited.
ON_LOOP_ACTIONS = frozenset(MESSAGE_ACTIONS[:5])


def _unsupported(action: str) -> SqsError:
    return SqsError("InvalidAction", f"The action {action!r:.80} is not valid for this endpoint.")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


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


def _then(answer: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` of an answer, or of a Parked one's once it comes."""
    return answer.followed(fn) if isinstance(answer, Parked) else fn(answer)


def _always(result: Any) -> bool:
    return True


async def _refused(deleting: Awaitable[None]) -> set[str]:
    """The receipts a delete refused (none when all were taken)."""
    try:
        await deleting
        return set()
    except ReceiptInvalid as err:
        return set(err.receipts)

