"""The SQS actions on queues: create, find, list, delete, purge, attributes, tags,
permissions, dead-letter sources. Each is ``action(api, target, params) -> response``;
``api`` gives the settings store (``api.state``) and the clock (``api.clock``)."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from rayq.sqs import attributes as attrs
from rayq.sqs import policy
from rayq.sqs.errors import SqsError, int_param, invalid, missing
from rayq.sqs.names import QueueId, from_rayq, is_fifo, valid_name
from rayq.sqs.target import Target

PURGE_INTERVAL_S = 60.0


def settings_of(api, t: Target, queue: QueueId | None = None) -> attrs.Settings:
    queue = queue or t.need()
    return api.state.settings(queue.account, queue.rayq_name(t.home))


def save(api, t: Target, settings: attrs.Settings | None, queue: QueueId | None = None) -> None:
    queue = queue or t.need()
    api.state.save(queue.account, queue.rayq_name(t.home), settings)


def create_queue(api, t: Target, p: dict) -> dict:
    queue = t.named(_queue_name_param(p))
    now = api.clock()
    exists = t.exists(queue)
    base = settings_of(api, t, queue) if exists else attrs.Settings(fifo=is_fifo(queue.name))
    wanted = attrs.parse(p.get("Attributes"), base, now, creating=True)
    if wanted.fifo != is_fifo(queue.name):
        raise invalid("The name of a FIFO queue can only include alphanumeric characters, "
                      "hyphens, or underscores, must end with .fifo suffix and be 1 to 80 in "
                      "length.")
    if exists:
        different = base.differs_from(wanted)
        if different:
            raise SqsError("QueueNameExists", "A queue already exists with the same name and a "
                                              f"different value for attribute {different}")
        return {"QueueUrl": t.url(queue)}
    check_redrive(api, t, queue, wanted)
    tags = policy.tagged((), p["tags"], queue.name) if p.get("tags") else ()
    # the endpoint dead-letters itself; a FIFO queue is ordered: its groups are its keys
    t.client.create_queue(t.ref(queue), max_receives=None, ordered=wanted.fifo)
    save(api, t, dataclasses.replace(wanted, modified_at=now, tags=tags), queue)
    return {"QueueUrl": t.url(queue)}


def get_queue_url(api, t: Target, p: dict) -> dict:
    queue = t.named(_queue_name_param(p))
    owner = p.get("QueueOwnerAWSAccountId")
    if owner is not None:
        queue = t.from_arn(f"arn:aws:sqs:{t.region}:{owner}:{queue.name}")
    t.info(queue)
    return {"QueueUrl": t.url(queue)}


def _listed(t: Target) -> list[QueueId]:
    """The caller's SQS queues of the request's region (every account's for ``default``),
    by rayq name order, with rayq's own dead-letter queue of each queue that dead-letters
    into it (``max_receives``)."""
    out = []
    for ref in sorted(t.client.list_queues()):
        owner, _, name = ref.rpartition("/")
        queue = from_rayq(owner or t.caller.account, name, t.region, t.home)
        if queue is not None:
            out.append(queue)
            if t.redrives_to_own(queue) is not None and t.own_dead_letters(queue.dead_letters()):
                out.append(queue.dead_letters())
    return out


def own_redrive(t: Target, queue: QueueId) -> str | None:
    """The RedrivePolicy SQS would show for a queue made with rayq's ``max_receives``: its
    ``<name>-dlq`` and that count; None for other queues."""
    count = t.redrives_to_own(queue)
    if count is None or not t.own_dead_letters(queue.dead_letters()):
        return None
    return json.dumps({"deadLetterTargetArn": queue.dead_letters().arn(),
                       "maxReceiveCount": count})


def list_queues(api, t: Target, p: dict) -> dict:
    prefix = p.get("QueueNamePrefix", "")
    if not isinstance(prefix, str):
        raise invalid("QueueNamePrefix must be a string.")
    out = _page(p, "QueueUrls", lambda: sorted(
        t.url(q) for q in _listed(t) if q.name.startswith(prefix)))
    if not out["QueueUrls"]:  # SQS leaves an empty list out
        del out["QueueUrls"]
    return out


def delete_queue(api, t: Target, p: dict) -> dict:
    t.info()
    if t.own_dead_letters(t.need()):
        raise invalid(f"Queue {t.need().name} is the dead-letter queue rayq keeps for "
                      f"{t.need().source().name}: it goes with that queue.")
    t.client.delete_queue(t.ref(t.need()))
    save(api, t, None)
    return {}


def purge_queue(api, t: Target, p: dict) -> dict:
    t.info()
    settings, now = settings_of(api, t), api.clock()
    if now - settings.purged_at < PURGE_INTERVAL_S:
        raise SqsError("PurgeQueueInProgress", f"Only one PurgeQueue operation on "
                                               f"{t.need().name} is allowed every 60 seconds.")
    save(api, t, dataclasses.replace(settings, purged_at=now))
    t.queue().clear()
    return {}


def get_queue_attributes(api, t: Target, p: dict) -> dict:
    names = attrs.check_names(p.get("AttributeNames"))
    info = t.info()
    settings = settings_of(api, t)
    values = settings.render()
    redrive = own_redrive(t, t.need()) if attrs.REDRIVE not in values else None
    if redrive is not None:
        values[attrs.REDRIVE] = redrive
    values.update(CreatedTimestamp=str(int(info.created_at)),
                  LastModifiedTimestamp=str(int(settings.modified_at or info.created_at)),
                  QueueArn=t.need().arn())
    if any(n in attrs.COUNTS for n in names):
        values.update(zip(attrs.COUNTS, map(str, t.queue().counts_by_visibility())))
    picked = {n: values[n] for n in names if n in values}
    return {"Attributes": picked} if picked else {}


def set_queue_attributes(api, t: Target, p: dict) -> dict:
    if "Attributes" not in p:
        raise missing("Attributes")
    t.info()
    base = settings_of(api, t)
    settings = attrs.parse(p["Attributes"], base, api.clock(), creating=False)
    if settings.redrive != base.redrive:
        check_redrive(api, t, t.need(), settings)
    save(api, t, settings)
    return {}


def check_redrive(api, t: Target, queue: QueueId, settings: attrs.Settings) -> None:
    """A redrive policy's target must be an existing queue of the same kind (FIFO or not)
    that lets ``queue`` dead-letter into it. Raises InvalidParameterValue."""
    target = attrs.redrive_target(settings)
    if target is None:
        return
    reason = None
    try:
        dead = t.from_arn(target[0])
        exists = t.exists(dead)
    except SqsError:
        exists = False
    if not exists:
        reason = "Dead letter target does not exist."
    elif is_fifo(dead.name) != settings.fifo:
        reason = "Dead letter target must be the same type of queue (FIFO or standard)."
    elif not attrs.redrive_allows(settings_of(api, t, dead), queue.arn()):
        reason = "Dead letter target does not allow this queue as a source queue."
    if reason:
        raise invalid(f"Value {settings.redrive} for parameter RedrivePolicy is invalid. "
                      f"Reason: {reason}")


def list_dead_letter_source_queues(api, t: Target, p: dict) -> dict:
    t.info()
    return _page(p, "queueUrls", lambda: dead_letter_sources(api, t, t.need()))


def dead_letter_sources(api, t: Target, queue: QueueId) -> list[str]:
    """The URLs of the queues whose redrive policy names ``queue`` (and the queue whose
    own rayq dead letters ``queue`` holds), sorted."""
    arn = queue.arn()
    urls = sorted(t.url(q) for q in _listed(t) if q.account == queue.account and
                  (attrs.redrive_target(settings_of(api, t, q)) or ("",))[0] == arn)
    source = queue.source()
    if source is not None and t.own_dead_letters(queue) and t.url(source) not in urls:
        urls = sorted(urls + [t.url(source)])  # rayq's own dead letters of a queue
    return urls


# -- tags and permissions ------------------------------------------------------------
def tag_queue(api, t: Target, p: dict) -> dict:
    t.info()
    settings = settings_of(api, t)
    save(api, t, dataclasses.replace(
        settings, tags=policy.tagged(settings.tags, p.get("Tags"), t.need().name)))
    return {}


def untag_queue(api, t: Target, p: dict) -> dict:
    t.info()
    settings = settings_of(api, t)
    save(api, t, dataclasses.replace(settings,
                                     tags=policy.untagged(settings.tags, p.get("TagKeys"))))
    return {}


def list_queue_tags(api, t: Target, p: dict) -> dict:
    t.info()
    tags = settings_of(api, t).tags
    return {"Tags": dict(tags)} if tags else {}


def add_permission(api, t: Target, p: dict) -> dict:
    return _edit_policy(api, t, p, policy.with_permission)


def remove_permission(api, t: Target, p: dict) -> dict:
    return _edit_policy(api, t, p, policy.without_permission)


def _edit_policy(api, t: Target, p: dict, edit) -> dict:
    t.info()
    settings = settings_of(api, t)
    document = edit(settings.text(attrs.POLICY), t.need().arn(), p)
    save(api, t, attrs.parse({attrs.POLICY: document}, settings, api.clock(), creating=False))
    return {}


# -- parameters ---------------------------------------------------------------------------
def _queue_name_param(p: dict) -> str:
    name = p.get("QueueName")
    if name is None:
        raise missing("QueueName")
    if not valid_name(name):
        raise invalid("Can only include alphanumeric characters, hyphens, or underscores. "
                      "1 to 80 in length")
    return name


def _page(p: dict, key: str, listed: Callable[[], list[str]]) -> dict:
    """One page, under ``key``, of the sorted URLs ``listed()`` gives: those after the
    request's NextToken, MaxResults of them (1 to 1000; all without), and the
    NextToken of the page after when more are left. The parameters are checked
    before anything is listed."""
    limit = int_param(p, "MaxResults", 1, 1000)
    after = _token(p.get("NextToken"))
    urls = [u for u in listed() if u > after]
    out: dict[str, Any] = {key: urls[:limit or 1000]}
    if limit is not None and len(urls) > limit:
        out["NextToken"] = base64.urlsafe_b64encode(urls[limit - 1].encode()).decode()
    return out


def _token(token: Any) -> str:
    if token is None:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, AttributeError, UnicodeError):
        raise invalid("Invalid NextToken value.") from None


ACTIONS = {
    "CreateQueue": create_queue, "GetQueueUrl": get_queue_url, "ListQueues": list_queues,
    "DeleteQueue": delete_queue, "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes, "SetQueueAttributes": set_queue_attributes,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues, "TagQueue": tag_queue,
    "UntagQueue": untag_queue, "ListQueueTags": list_queue_tags,
    "AddPermission": add_permission, "RemovePermission": remove_permission,
}
