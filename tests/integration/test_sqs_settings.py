"""A queue's own SQS settings apply to ReceiveMessage calls that do not name them:
VisibilityTimeout and ReceiveMessageWaitTimeSeconds (driven by boto3)."""

import itertools

import pytest

from .conftest import boto3_sqs, sqs_endpoint

_names = itertools.count()


@pytest.fixture(scope="module")
def sqs(ray_session, tmp_path_factory):
    """A boto3 SQS client of account ``acme`` on a fresh endpoint."""
    with sqs_endpoint(tmp_path_factory, "sqs-settings") as (url, keys, _):
        yield boto3_sqs(url, "acme", keys["acme"])


def new_queue(sqs, **attributes) -> str:
    return sqs.create_queue(QueueName=f"settings{next(_names)}",
                            Attributes=attributes)["QueueUrl"]


def receive(sqs, url, **params) -> list[dict]:
    return sqs.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"],
                               **params).get("Messages", [])


def test_a_queue_with_visibility_timeout_0_delivers_again_at_once(sqs):
    url = new_queue(sqs, VisibilityTimeout="0")
    sqs.send_message(QueueUrl=url, MessageBody="again")
    [first] = receive(sqs, url)
    [second] = receive(sqs, url)        # not hidden: the queue's timeout is 0 s, not 30 s
    assert [m["Body"] for m in (first, second)] == ["again", "again"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])


def test_a_receive_naming_a_visibility_timeout_overrides_the_queues(sqs):
    url = new_queue(sqs, VisibilityTimeout="0")
    sqs.send_message(QueueUrl=url, MessageBody="held")
    [held] = receive(sqs, url, VisibilityTimeout=3600)
    assert receive(sqs, url) == []      # hidden for the hour this receive asked for
    sqs.delete_message(QueueUrl=url, ReceiptHandle=held["ReceiptHandle"])


def test_a_queue_with_a_long_visibility_timeout_hides_what_it_delivered(sqs):
    url = new_queue(sqs, VisibilityTimeout="3600")
    sqs.send_message(QueueUrl=url, MessageBody="hidden")
    [got] = receive(sqs, url)
    assert receive(sqs, url) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])


def test_a_queue_with_a_wait_time_long_polls_by_default(sqs):
    """The message becomes visible 2 s after it is sent; a receive with no WaitTimeSeconds
    on a queue whose ReceiveMessageWaitTimeSeconds is 20 waits for it (a receive that
    did not wait would return nothing)."""
    url = new_queue(sqs, ReceiveMessageWaitTimeSeconds="20")
    sqs.send_message(QueueUrl=url, MessageBody="awaited", DelaySeconds=2)
    [got] = receive(sqs, url)
    assert got["Body"] == "awaited"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
