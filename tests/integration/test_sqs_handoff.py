"""Connections move to their queue's shard (rayq.handoff), driven by boto3 across real
kills: a plain-HTTP connection whose queue lives in one shard is answered by that shard
once a replica handed it over, so it outlives every replica; stopping the endpoint
closes it."""

import pytest
import ray
from botocore.exceptions import BotoCoreError

import rayq
from rayq.names import namespace
from rayq.sqs.service import STATE, replica_name
from rayq.config import with_consumers
from rayq.remote import actor_names
from rayq.runtime.local import free_port
from rayq.runtime.serving import stop_sqs

from .conftest import boto3_sqs, start_runtime

REGION = "eu-west-1"


@pytest.fixture(scope="module")
def key(ray_session, tmp_path_factory):
    """acme's key on a runtime of this module's own (no consumers)."""
    admin, _ = start_runtime(tmp_path_factory, with_consumers(rayq.Config(), 0),
                             name="sqshandoff")
    yield admin.create_account("acme")
    rayq.shutdown()


def moved_client(key: str):
    """A boto3 client (one attempt per call) and a queue, its connection moved: the
    endpoint hands it over after answering its first message action."""
    client = boto3_sqs(rayq.serve_sqs(port=free_port()), "acme", key, REGION)
    url = client.create_queue(QueueName="moved")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="first")
    return client, url


def kill_replicas() -> None:
    """Kill every replica for good: no process listens on the endpoint's port after."""
    replicas = [n for n in actor_names() if n.startswith(replica_name("")) and n != STATE]
    assert replicas
    for name in replicas:
        ray.kill(ray.get_actor(name, namespace=namespace()), no_restart=True)


def test_a_moved_connection_is_answered_by_its_shard_after_every_replica_is_killed(key):
    client, url = moved_client(key)
    kill_replicas()
    client.send_message(QueueUrl=url, MessageBody="second")  # the same connection
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["first", "second"]
    client.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
    assert "Messages" not in client.receive_message(QueueUrl=url)
    stop_sqs()


def test_stopping_the_endpoint_closes_the_connections_shards_were_handed(key):
    client, url = moved_client(key)
    kill_replicas()
    client.send_message(QueueUrl=url, MessageBody="moved")  # the shard holds it
    stop_sqs()
    with pytest.raises(BotoCoreError):  # closed, and no replica takes a new one
        client.send_message(QueueUrl=url, MessageBody="after")
