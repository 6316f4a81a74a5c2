"""SQS message move tasks driven by boto3: a task runs in the background at its rate, is
seen RUNNING, completes, cancels midway without losing or doubling a message, refuses a
second task on its source, and goes on after its state actor is killed."""

import json

import ray

from rayq.names import namespace
from rayq.sqs.service import STATE
from rayq.sqs.moves import new_handle

from .test_sqs import endpoint, eventually, new_queue, refused, sqs  # noqa: F401 (fixture)


def arn_of(client, url: str) -> str:
    return client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]


def filled(client, count: int) -> tuple[str, str, set[str]]:
    """(source url, its ARN, the bodies sent to it): a dead-letter queue, as a move
    task's source must be (another queue's redrive policy names it)."""
    url = new_queue(client)
    new_queue(client, RedrivePolicy=json.dumps({"deadLetterTargetArn": arn_of(client, url),
                                                "maxReceiveCount": 5}))
    bodies = {f"m{i}" for i in range(count)}
    for chunk in range(0, count, 10):
        client.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": f"m{i}"} for i in range(chunk, min(count, chunk + 10))])
    return url, arn_of(client, url), bodies


def drained(client, url: str) -> list[str]:
    """Every body the queue holds (received, hidden long, not deleted), duplicates kept."""
    out = []
    while True:
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                     VisibilityTimeout=600).get("Messages", [])
        out += [m["Body"] for m in got]
        if not got and visible(client, url) == 0:
            return out


def visible(client, url: str) -> int:
    return int(client.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"])


def latest(client, source_arn: str) -> dict:
    return client.list_message_move_tasks(SourceArn=source_arn)["Results"][0]


def ended(client, source_arn: str) -> dict:
    return eventually(lambda: (lambda t: t if t["Status"] not in ("RUNNING", "CANCELLING")
                               else None)(latest(client, source_arn)), timeout_s=120)


def test_a_slow_task_is_seen_running_then_completes_with_every_message_moved(endpoint):
    client = sqs(endpoint)
    url, source_arn, bodies = filled(client, 12)
    destination = new_queue(client)
    handle = client.start_message_move_task(SourceArn=source_arn, DestinationArn=arn_of(
        client, destination), MaxNumberOfMessagesPerSecond=3)["TaskHandle"]
    running = latest(client, source_arn)
    assert (running["Status"], running["TaskHandle"], running["ApproximateNumberOfMessagesToMove"],
            running["MaxNumberOfMessagesPerSecond"]) == ("RUNNING", handle, 12, 3)
    assert running["ApproximateNumberOfMessagesMoved"] < 12
    task = ended(client, source_arn)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"], "TaskHandle" in task) == (
        "COMPLETED", 12, False)
    moved = drained(client, destination)
    assert sorted(moved) == sorted(bodies) and drained(client, url) == []


def test_a_task_goes_on_after_its_accounts_key_is_rotated(endpoint):
    client = sqs(endpoint, "tool")
    url, source_arn, bodies = filled(client, 12)
    destination = new_queue(client)
    client.start_message_move_task(SourceArn=source_arn, DestinationArn=arn_of(
        client, destination), MaxNumberOfMessagesPerSecond=2)
    eventually(lambda: latest(client, source_arn)["ApproximateNumberOfMessagesMoved"] > 0)
    # the key the task started with (and this client signs with) is replaced
    fresh = sqs(endpoint, "tool", endpoint["admin"].rotate_key(1, account="tool"))
    task = ended(fresh, source_arn)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 12)
    assert sorted(drained(fresh, destination)) == sorted(bodies) and drained(fresh, url) == []


def test_a_second_task_on_a_running_source_is_refused(endpoint):
    client = sqs(endpoint)
    _, source_arn, _ = filled(client, 10)
    destination = arn_of(client, new_queue(client))
    handle = client.start_message_move_task(SourceArn=source_arn, DestinationArn=destination,
                                            MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    assert refused(client.start_message_move_task, SourceArn=source_arn,
                   DestinationArn=destination) == ("InvalidParameterValue", 400)
    client.cancel_message_move_task(TaskHandle=handle)
    assert ended(client, source_arn)["Status"] == "CANCELLED"
    assert client.start_message_move_task(SourceArn=source_arn, DestinationArn=destination)
    assert ended(client, source_arn)["Status"] == "COMPLETED"
    listed = client.list_message_move_tasks(SourceArn=source_arn, MaxResults=10)["Results"]
    assert [t["Status"] for t in listed] == ["COMPLETED", "CANCELLED"]  # newest first


def test_a_cancel_midway_leaves_each_message_in_one_queue_once(endpoint):
    client = sqs(endpoint)
    url, source_arn, bodies = filled(client, 40)
    destination = new_queue(client)
    handle = client.start_message_move_task(SourceArn=source_arn, DestinationArn=arn_of(
        client, destination), MaxNumberOfMessagesPerSecond=2)["TaskHandle"]
    eventually(lambda: latest(client, source_arn)["ApproximateNumberOfMessagesMoved"] >= 2)
    moved_at_cancel = client.cancel_message_move_task(TaskHandle=handle)[
        "ApproximateNumberOfMessagesMoved"]
    task = ended(client, source_arn)
    assert task["Status"] == "CANCELLED"
    assert moved_at_cancel <= task["ApproximateNumberOfMessagesMoved"] < 40
    assert refused(client.cancel_message_move_task, TaskHandle=handle) == (
        "ResourceNotFoundException", 404)
    in_destination, in_source = drained(client, destination), drained(client, url)
    assert len(in_destination) == task["ApproximateNumberOfMessagesMoved"]
    assert sorted(in_destination + in_source) == sorted(bodies)  # each once, in one queue


def test_cancelling_a_foreign_unknown_or_malformed_handle_is_refused(endpoint):
    client = sqs(endpoint)
    _, source_arn, _ = filled(client, 10)
    handle = client.start_message_move_task(SourceArn=source_arn,
                                            MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    assert refused(sqs(endpoint, "beta").cancel_message_move_task, TaskHandle=handle) == (
        "ResourceNotFoundException", 404)  # another account's source: as if it did not exist
    assert refused(client.cancel_message_move_task, TaskHandle=new_handle(source_arn)) == (
        "ResourceNotFoundException", 404)
    assert refused(client.cancel_message_move_task, TaskHandle="not-a-handle")[0] == \
        "InvalidParameterValue"
    assert latest(client, source_arn)["Status"] == "RUNNING"
    client.cancel_message_move_task(TaskHandle=handle)
    assert ended(client, source_arn)["Status"] == "CANCELLED"


def test_a_task_goes_on_after_its_state_actor_is_killed(endpoint):
    client = sqs(endpoint)
    url, source_arn, bodies = filled(client, 30)
    destination = new_queue(client)
    client.start_message_move_task(SourceArn=source_arn, DestinationArn=arn_of(
        client, destination), MaxNumberOfMessagesPerSecond=3)
    eventually(lambda: latest(client, source_arn)["ApproximateNumberOfMessagesMoved"] >= 3)
    ray.kill(ray.get_actor(STATE, namespace=namespace()), no_restart=False)
    task = ended(client, source_arn)
    assert task["Status"] == "COMPLETED"
    in_destination = drained(client, destination)
    assert set(in_destination) <= bodies
    # at least once: what the kill cut short is back in the source, hidden until HIDE_S ends
    counts = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    left = int(counts["ApproximateNumberOfMessages"]) + int(
        counts["ApproximateNumberOfMessagesNotVisible"])
    assert len(set(in_destination)) + left >= len(bodies)


def test_a_queue_no_redrive_policy_names_is_not_a_move_task_source(endpoint):
    client = sqs(endpoint)
    plain = new_queue(client)
    assert refused(client.start_message_move_task, SourceArn=arn_of(client, plain)) == (
        "InvalidParameterValue", 400)

