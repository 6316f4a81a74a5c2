"""Message move tasks: redriving a dead-letter queue's messages back to the queues they
came from (or to one destination), as StartMessageMoveTask does.

A task runs within its StartMessageMoveTask call, up to :data:`MAX_MOVED` messages (a
start more moves the rest), and is then recorded as COMPLETED with the source queue's
settings, where ListMessageMoveTasks reads it. A running task is therefore never seen,
and CancelMessageMoveTask always answers ResourceNotFoundException.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from typing import Any

from rayq.core.codec.model import Outgoing
from rayq.sqs import messages as msgs
from rayq.sqs import queues
from rayq.sqs.errors import SqsError, invalid
from rayq.sqs.target import Target

MAX_MOVED = 10_000
BATCH = 10
HIDE_S = 60        # a message being moved is hidden this long, should the move be cut short
KEPT_TASKS = 10


def _not_found(what: str) -> SqsError:
    return SqsError("ResourceNotFoundException", f"The resource that you specified for the "
                                                 f"{what} parameter doesn't exist.")


def _existing(t: Target, p: dict, parameter: str):
    """The queue the ARN in ``p[parameter]`` names. Raises ResourceNotFoundException
    when it names none."""
    try:
        queue = t.from_arn(p.get(parameter))
        t.info(queue)
        return queue
    except SqsError:
        raise _not_found(parameter) from None


def start_message_move_task(api, t: Target, p: dict) -> dict:
    source_arn = p.get("SourceArn")
    source = _existing(t, p, "SourceArn")
    destination = p.get("DestinationArn")
    to = None if destination is None else _existing(t, p, "DestinationArn")
    if to is None and t.own_dead_letters(source):  # rayq's own <name>-dlq: back to <name>
        to = source.source()
    rate = p.get("MaxNumberOfMessagesPerSecond")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)
                             or not 1 <= rate <= 500):
        raise invalid("MaxNumberOfMessagesPerSecond must be between 1 and 500.")
    started = api.clock()
    moved, left = _move(t, source, to)
    handle = base64.urlsafe_b64encode(json.dumps(
        {"task": uuid.uuid4().hex, "source": source_arn}).encode()).decode()
    task = {"TaskHandle": handle, "Status": "COMPLETED", "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": moved,
            "ApproximateNumberOfMessagesToMove": moved + left,
            "StartedTimestamp": int(started * 1000)}
    if destination is not None:
        task["DestinationArn"] = destination
    if rate is not None:
        task["MaxNumberOfMessagesPerSecond"] = rate
    settings = queues.settings_of(api, t, source)
    kept = (json.dumps(task),) + settings.moves[:KEPT_TASKS - 1]
    queues.save(api, t, dataclasses.replace(settings, moves=kept), source)
    return {"TaskHandle": handle}


def _move(t: Target, source, to) -> tuple[int, int]:
    """Move messages from ``source`` to ``to`` (None: each to the queue it was
    dead-lettered from); (moved, left behind: no destination known)."""
    queue, moved, left = t.queue(source), 0, 0
    while moved + left < MAX_MOVED:
        got = queue.receive(max_messages=BATCH, visibility_timeout_s=HIDE_S)
        if not got:
            break
        by_destination: dict[Any, list] = {}
        for m in got:
            envelope = msgs.opened(m.body)
            destination = to or (t.from_arn(envelope.source) if envelope.source else None)
            if destination is None:
                left += 1
                continue
            by_destination.setdefault(destination, []).append((m, envelope))
        for destination, batch in by_destination.items():
            ordered = t.ordered(destination)
            t.queue(destination).send_batch([Outgoing(
                envelope.moved(source=None).stored(), type=m.type,
                key=msgs.key_in(ordered, m, envelope)) for m, envelope in batch])
            queue.delete_batch([m.receipt for m, _ in batch])
            moved += len(batch)
        if len(got) < BATCH and not by_destination:
            break
    return moved, left


def list_message_move_tasks(api, t: Target, p: dict) -> dict:
    try:
        source = t.from_arn(p.get("SourceArn"))
        t.info(source)
    except SqsError:
        raise _not_found("SourceArn") from None
    limit = p.get("MaxResults", 1)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10:
        raise invalid("MaxResults must be between 1 and 10.")
    tasks = [json.loads(task) for task in queues.settings_of(api, t, source).moves[:limit]]
    return {"Results": tasks}


def cancel_message_move_task(api, t: Target, p: dict) -> dict:
    raise SqsError("ResourceNotFoundException", "Task does not exist or is not running: "
                                                "move tasks complete within their start.")


ACTIONS = {"StartMessageMoveTask": start_message_move_task,
           "ListMessageMoveTasks": list_message_move_tasks,
           "CancelMessageMoveTask": cancel_message_move_task}
