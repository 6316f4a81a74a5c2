"""The SQS endpoint driven by boto3 across real kills: ApproximateFirstReceiveTimestamp is
stored with the message, so a second receive after the visibility timeout, through a
restarted endpoint replica and a restarted shard, shows the first receive's time."""

import os
import re
import time

import pytest
import ray
from botocore.exceptions import BotoCoreError, ClientError

from rayq.names import namespace
from rayq.sqs.service import replica_name
from rayq.remote import actor_names

from .conftest import boto3_sqs, sqs_endpoint

REGION = "eu-west-1"
NAMES = ["ApproximateFirstReceiveTimestamp", "ApproximateReceiveCount"]


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    with sqs_endpoint(tmp_path_factory, "sqsrestarts") as (url, keys, _):
        yield boto3_sqs(url, "acme", keys["acme"], REGION)


def pid_of(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def kill_and_await_restart(names: list[str]) -> None:
    """Kill the named runtime actors for real (Ray restarts them) and wait until each runs
    in a new process."""
    actors = {name: ray.get_actor(name, namespace=namespace()) for name in names}
    before = {name: pid_of(actor) for name, actor in actors.items()}
    for actor in actors.values():
        ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 120
    for name, actor in actors.items():
        while True:
            try:
                if pid_of(actor) != before[name]:
                    break
            except ray.exceptions.RayError:
                pass  # still restarting
            assert time.monotonic() < deadline, f"{name} did not restart"
            time.sleep(0.2)


def receive_again(client, url: str) -> dict:
    """The message once the endpoint answers again and its visibility timeout ran out."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            got = client.receive_message(QueueUrl=url, AttributeNames=NAMES).get("Messages")
        except (BotoCoreError, ClientError):
            got = None  # the replica is still coming back
        if got:
            return got[0]
        time.sleep(0.2)
    raise AssertionError("the message did not come back")


def test_the_first_receive_time_is_the_same_after_the_replica_and_the_shard_restart(client):
    url = client.create_queue(QueueName="kept-first")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="hello")
    [first] = client.receive_message(QueueUrl=url, VisibilityTimeout=1,
                                     AttributeNames=NAMES)["Messages"]
    shards = [n for n in actor_names() if re.fullmatch(r"rayq-shard-\d+", n)]
    kill_and_await_restart([replica_name(0), *shards])
    second = receive_again(client, url)
    assert second["MessageId"] == first["MessageId"]
    assert second["Attributes"] == {"ApproximateReceiveCount": "2",
                                    "ApproximateFirstReceiveTimestamp": first["Attributes"][
                                        "ApproximateFirstReceiveTimestamp"]}
