"""The SQS endpoint driven by boto3: message groups are the fairness keys of an account's
standard queue, a queue made with rayq's ``max_receives`` shows its dead-letter queue as
SQS would."""

import itertools
import json

import pytest
from botocore.exceptions import ClientError

import rayq
from rayq.sqs.names import account_id

from .conftest import boto3_sqs, sqs_endpoint
from .test_sqs import code, eventually

_names = itertools.count()
REGION = "us-east-1"  # the home region: the SQS queue of a name is the rayq queue of it


@pytest.fixture(scope="module")
def runtime(ray_session, tmp_path_factory):
    with sqs_endpoint(tmp_path_factory, "sqsgroups") as (url, keys, admin):
        yield {"sqs": boto3_sqs(url, "acme", keys["acme"], REGION),
               "acme": rayq.connect(account="acme", key=keys["acme"]), "admin": admin}


def name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def send(sqs, url: str, group: str | None, *bodies: str) -> None:
    for start in range(0, len(bodies), 10):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": body, **({"MessageGroupId": group} if group else {})}
            for i, body in enumerate(bodies[start:start + 10])])


def receive(sqs, url: str, n: int = 10, visibility_s: int = 60) -> list[dict]:
    return sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=n, VisibilityTimeout=visibility_s,
                               AttributeNames=["All"]).get("Messages", [])


# -- message groups on a standard queue ----------------------------------------------------
def test_a_small_group_is_not_stuck_behind_a_large_groups_backlog(runtime):
    sqs = runtime["sqs"]
    url = sqs.create_queue(QueueName=name("groups"))["QueueUrl"]
    send(sqs, url, "big", *[f"big{i}" for i in range(200)])
    send(sqs, url, "small", *[f"small{i}" for i in range(5)])
    send(sqs, url, None, "plain")
    first = receive(sqs, url) + receive(sqs, url)
    bodies = [m["Body"] for m in first]
    assert {f"small{i}" for i in range(5)} <= set(bodies)  # not behind 200 of big's
    assert "plain" in bodies  # messages without a group share one key of their own
    groups = {m["Body"]: m["Attributes"]["MessageGroupId"] for m in first}
    assert groups["small0"] == "small" and groups["big0"] == "big"
    # the tenant stays the account: that is who sent them
    assert {m["Attributes"]["SenderId"] for m in first} == {"acme"}


# -- rayq's own dead-letter queue -------------------------------------------------------------
def test_a_rayq_queue_with_max_receives_shows_its_dead_letter_queue(runtime):
    sqs, acme = runtime["sqs"], runtime["acme"]
    queue = name("orders")
    acme.create_queue(queue, max_receives=2)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    dlq_url = sqs.get_queue_url(QueueName=queue + "-dlq")["QueueUrl"]
    assert dlq_url == url + "-dlq"
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    arn = f"arn:aws:sqs:{REGION}:{account_id('acme')}:{queue}-dlq"
    assert json.loads(got["RedrivePolicy"]) == {"deadLetterTargetArn": arn,
                                                "maxReceiveCount": 2}
    dlq_attrs = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])
    assert dlq_attrs["Attributes"]["QueueArn"] == arn
    assert {url, dlq_url} <= set(sqs.list_queues(QueueNamePrefix=queue)["QueueUrls"])
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]

    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):
        assert [m["Body"] for m in eventually(lambda: receive(sqs, url, 1, 0))] == ["poison"]
    # the receive past max_receives moves it to the dead-letter queue, which SQS reaches
    dead = eventually(lambda: receive(sqs, dlq_url, 1) or receive(sqs, url, 1, 0) and None)
    assert [m["Body"] for m in dead] == ["poison"]
    sqs.change_message_visibility(QueueUrl=dlq_url, ReceiptHandle=dead[0]["ReceiptHandle"],
                                  VisibilityTimeout=0)
    sqs.start_message_move_task(SourceArn=arn)  # back to the queue it dead-lettered from
    back = eventually(lambda: receive(sqs, url, 1))
    assert [m["Body"] for m in back] == ["poison"] and receive(sqs, dlq_url) == []
    with pytest.raises(ClientError) as refused:  # it goes with its queue
        sqs.delete_queue(QueueUrl=dlq_url)
    assert code(refused.value) == "InvalidParameterValue"


def test_a_queue_without_a_redrive_policy_still_shows_no_dead_letter_queue(runtime):
    sqs, acme = runtime["sqs"], runtime["acme"]
    queue = name("plain")
    acme.create_queue(queue, max_receives=None)
    sqs_made = sqs.create_queue(QueueName=name("made"))["QueueUrl"]
    for url in (sqs.get_queue_url(QueueName=queue)["QueueUrl"], sqs_made):
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert "RedrivePolicy" not in got
        with pytest.raises(ClientError) as missing:
            sqs.get_queue_url(QueueName=url.rsplit("/", 1)[1] + "-dlq")
        assert code(missing.value) == "QueueDoesNotExist"
    listed = sqs.list_queues()["QueueUrls"]
    assert not any(u.endswith(("/" + queue + "-dlq", sqs_made.rsplit("/", 1)[1] + "-dlq"))
                   for u in listed)


# -- a FIFO queue made before FIFO queues were ordered ---------------------------------------
