"""FIFO queues through the SQS endpoint, driven by boto3: a message group is held while
one of its messages is in flight, keeps its order across a redelivery, and groups share
the queue fairly."""

import itertools
import threading

import pytest

from rayq.sqs import service as state_actor
from rayq.sqs.fifo import WINDOW_S

from .conftest import boto3_sqs, sqs_endpoint
from .test_sqs import eventually

_names = itertools.count()
REGION = "eu-west-1"


@pytest.fixture(scope="module")
def endpoint(ray_session, tmp_path_factory):
    """(url, acme's key)."""
    with sqs_endpoint(tmp_path_factory, "sqsfifo") as (url, keys, _):
        yield url, keys["acme"]


@pytest.fixture(scope="module")
def client(endpoint):
    return boto3_sqs(endpoint[0], "acme", endpoint[1], REGION)


def fifo_queue(client) -> str:
    return client.create_queue(QueueName=f"fifo{next(_names)}.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]


def send(client, url, group: str, *bodies: str) -> None:
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": body, "MessageGroupId": group}
        for i, body in enumerate(bodies)])


def receive(client, url, n: int, visibility_s: int = 30) -> list[dict]:
    return client.receive_message(QueueUrl=url, MaxNumberOfMessages=n,
                                  VisibilityTimeout=visibility_s,
                                  AttributeNames=["All"]).get("Messages", [])


def bodies(messages: list[dict]) -> list[str]:
    return [m["Body"] for m in messages]


def test_a_group_is_held_while_its_message_is_in_flight_and_keeps_its_order_after(client):
    url = fifo_queue(client)
    send(client, url, "a", "a1", "a2")
    send(client, url, "b", "b1", "b2")
    held = receive(client, url, 1) + receive(client, url, 1)
    assert sorted(bodies(held)) == ["a1", "b1"]  # one group each: both held
    assert receive(client, url, 10) == []
    for m in held:  # a visibility timeout of 1 s from now
        client.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                         VisibilityTimeout=1)
    again = []

    def all_again():
        again.extend(receive(client, url, 10))
        return len(again) >= 4
    eventually(all_again)
    got = bodies(again)
    assert sorted(got) == ["a1", "a2", "b1", "b2"]
    assert got.index("a1") < got.index("a2") and got.index("b1") < got.index("b2")
    assert {m["Body"]: m["Attributes"]["ApproximateReceiveCount"] for m in again} == {
        "a1": "2", "a2": "1", "b1": "2", "b2": "1"}


def test_deleting_a_groups_message_releases_the_group(client):
    url = fifo_queue(client)
    send(client, url, "a", "a1", "a2")
    [a1] = receive(client, url, 1)
    assert receive(client, url, 10) == []
    client.delete_message(QueueUrl=url, ReceiptHandle=a1["ReceiptHandle"])
    assert bodies(receive(client, url, 10)) == ["a2"]


def test_groups_are_served_fairly_not_in_send_order(client):
    url = fifo_queue(client)
    send(client, url, "big", *[f"big{i}" for i in range(6)])
    send(client, url, "small", "small0")
    served = []
    for _ in range(2):
        [m] = receive(client, url, 1)
        served.append(m["Body"])
        client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert served == ["big0", "small0"]  # not behind big's backlog


def test_concurrent_sends_of_one_deduplication_id_store_one_message(client, endpoint):
    url = client.create_queue(QueueName=f"fifo{next(_names)}.fifo",
                              Attributes={"FifoQueue": "true"})["QueueUrl"]
    other = boto3_sqs(endpoint[0], "acme", endpoint[1], REGION)
    ids = [f"d{i}" for i in range(20)]
    answers: dict[str, list[str]] = {d: [] for d in ids}
    start = threading.Barrier(2)

    def sender(sqs) -> None:
        for d in ids:
            start.wait()  # both send d at once
            answers[d].append(sqs.send_message(
                QueueUrl=url, MessageBody=d, MessageGroupId=d,
                MessageDeduplicationId=d)["MessageId"])
    threads = [threading.Thread(target=sender, args=(sqs,)) for sqs in (client, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(set(got)) == 1 for got in answers.values())  # one id per message
    stored = []
    while batch := receive(client, url, 10):
        stored += bodies(batch)
    assert sorted(stored) == sorted(ids)


def test_a_purged_fifo_queue_still_holds_its_groups(client):
    url = fifo_queue(client)
    send(client, url, "a", "old")
    client.purge_queue(QueueUrl=url)
    send(client, url, "a", "a1", "a2")
    assert bodies(eventually(lambda: receive(client, url, 1))) == ["a1"]
    assert receive(client, url, 10) == []


def test_the_state_sweeps_each_queues_old_ids_and_drops_a_deleted_queues(tmp_path, monkeypatch):
    monkeypatch.setattr(state_actor, "SWEEP_EVERY", 2)
    state = state_actor.SqsState(str(tmp_path))
    try:
        for queue in ("quiet.fifo", "busy.fifo"):
            state.fifo_admit("acme", queue, ["k"], 0.0)
            state.fifo_record("acme", queue, [("k", f"id-{queue}", "1")], 0.0)
        state.fifo_record("acme", "quiet.fifo", [("j", "id-j", "2")], WINDOW_S + 1)
        # the quiet queue's second record swept its own old "k" (the busy queue's stays)
        [quiet] = state.fifo_admit("acme", "quiet.fifo", ["k"], WINDOW_S + 1)
        assert quiet.duplicate_of is None
        [busy] = state.fifo_admit("acme", "busy.fifo", ["k"], 1.0)
        assert busy.duplicate_of == "id-busy.fifo"
        state.save("acme", "busy.fifo", None)  # deleted: a queue made again starts afresh
        [again] = state.fifo_admit("acme", "busy.fifo", ["k"], 2.0)
        assert again.duplicate_of is None
    finally:
        state.kv.close()
