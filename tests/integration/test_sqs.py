"""The SQS endpoint driven by boto3, the real SDK: every operation, redelivery, the DLQ,
two accounts, refused credentials, and bad input that loses nothing."""

import datetime
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from urllib.parse import urlencode

import botocore.auth
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

import rayq
from rayq.sqs.names import access_key_id, account_id

from .conftest import boto3_sqs, free_port, sqs_endpoint

_names = itertools.count()
REGION = "eu-west-1"


@pytest.fixture(scope="module")
def endpoint(ray_session, tmp_path_factory):
    with sqs_endpoint(tmp_path_factory, "sqs", ("acme", "beta", "rot", "tool")) as (
            url, keys, admin):
        yield {"url": url, "keys": keys, "admin": admin}


def sqs(endpoint, account="acme", key=None):
    """A boto3 SQS client signing as ``account`` (retries off: each call is one request)."""
    return boto3_sqs(endpoint["url"], account, key or endpoint["keys"][account], REGION)


def code(err: ClientError) -> str:
    """SQS's error code as the JSON protocol names it (boto3 shows the legacy one as Code)."""
    error = err.response["Error"]
    return error.get("QueryErrorCode") or error["Code"]


def refused(call, *args, **kwargs) -> tuple[str, int]:
    with pytest.raises(ClientError) as info:
        call(*args, **kwargs)
    return code(info.value), info.value.response["ResponseMetadata"]["HTTPStatusCode"]


def new_queue(client, **attributes) -> str:
    name = f"sqs{next(_names)}"
    return client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]


def eventually(probe, timeout_s: float = 30.0):
    """Poll ``probe`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("the condition did not hold in time")


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


# -- queues ---------------------------------------------------------------------
def test_boto3_creates_finds_lists_configures_purges_and_deletes_queues(endpoint):
    client = sqs(endpoint)
    url = client.create_queue(QueueName="orders-x", Attributes={"VisibilityTimeout": "45",
                                                                "DelaySeconds": "2"})["QueueUrl"]
    assert url == f"{endpoint['url']}/{account_id('acme')}/orders-x"
    assert client.create_queue(QueueName="orders-x", Attributes={"VisibilityTimeout": "45"})[
        "QueueUrl"] == url  # same attributes: idempotent
    assert refused(client.create_queue, QueueName="orders-x",
                   Attributes={"VisibilityTimeout": "50"})[0] == "QueueNameExists"
    assert client.get_queue_url(QueueName="orders-x")["QueueUrl"] == url
    assert url in client.list_queues(QueueNamePrefix="orders-")["QueueUrls"]
    dlq = client.create_queue(QueueName="orders-x-dlq")["QueueUrl"]  # any name SQS allows
    first = client.list_queues(QueueNamePrefix="orders-x", MaxResults=1)
    rest = client.list_queues(QueueNamePrefix="orders-x", MaxResults=1, NextToken=first["NextToken"])
    assert first["QueueUrls"] + rest["QueueUrls"] == [url, dlq]  # rayq's own DLQs never show
    by_name = url.replace(account_id("acme"), "acme")  # a URL naming the account still works
    assert client.get_queue_attributes(QueueUrl=by_name, AttributeNames=["QueueArn"])

    client.set_queue_attributes(QueueUrl=url, Attributes={"ReceiveMessageWaitTimeSeconds": "1",
                                                          "MessageRetentionPeriod": "1209600"})
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: got[k] for k in ("VisibilityTimeout", "DelaySeconds", "MessageRetentionPeriod",
                                "ReceiveMessageWaitTimeSeconds", "MaximumMessageSize")} == {
        "VisibilityTimeout": "45", "DelaySeconds": "2", "MessageRetentionPeriod": "1209600",
        "ReceiveMessageWaitTimeSeconds": "1", "MaximumMessageSize": "1048576"}
    assert got["QueueArn"] == f"arn:aws:sqs:{REGION}:{account_id('acme')}:orders-x"
    assert abs(int(got["CreatedTimestamp"]) - time.time()) < 3600
    assert "RedrivePolicy" not in got

    client.send_message(QueueUrl=url, MessageBody="to purge")
    assert got_counts(client, url) == (0, 0, 1)  # the queue's DelaySeconds applies
    client.purge_queue(QueueUrl=url)
    assert got_counts(client, url) == (0, 0, 0)
    assert refused(client.purge_queue, QueueUrl=url)[0] == "PurgeQueueInProgress"
    client.delete_queue(QueueUrl=url)
    assert refused(client.get_queue_url, QueueName="orders-x")[0] == "QueueDoesNotExist"
    assert url not in client.list_queues().get("QueueUrls", [])


def got_counts(client, url) -> tuple[int, int, int]:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed"]
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return tuple(int(got[n]) for n in names)


# -- messages ---------------------------------------------------------------------
def test_messages_round_trip_with_their_type_tenant_and_md5s(endpoint):
    client = sqs(endpoint)
    url = new_queue(client)
    typed = {"type": {"DataType": "String", "StringValue": "report"}}
    sent = client.send_message(QueueUrl=url, MessageBody="héllo ✓", MessageAttributes=typed,
                               MessageGroupId="acme")
    assert sent["MD5OfMessageBody"] == md5("héllo ✓")
    batch = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(9)])
    assert len(batch["Successful"]) == 9 and not batch["Failed"]
    assert all(e["MD5OfMessageBody"] == md5(f"body {e['Id'][1:]}") for e in batch["Successful"])

    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"],
                                 MessageAttributeNames=["All"])["Messages"]
    assert sorted(m["Body"] for m in got) == sorted(["héllo ✓"] + [f"body {i}" for i in range(9)])
    first = next(m for m in got if m["MessageId"] == sent["MessageId"])
    assert first["MD5OfBody"] == md5("héllo ✓")
    assert first["MessageAttributes"] == typed
    assert first["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert first["Attributes"]["MessageGroupId"] == "acme"
    assert got_counts(client, url) == (0, 10, 0)

    client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    deleted = client.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[:10])
        if m is not first])
    assert len(deleted["Successful"]) == 9 and not deleted["Failed"]
    assert got_counts(client, url) == (0, 0, 0)


def test_any_message_attributes_round_trip_with_the_md5_sqs_computes(endpoint):
    client = sqs(endpoint)
    url = new_queue(client)
    attributes = {"color": {"DataType": "String", "StringValue": "red"},
                  "price": {"DataType": "Number.float", "StringValue": "12.5"},
                  "doc": {"DataType": "String.json", "StringValue": '{"k": "ü"}'},
                  "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xffraw"},
                  "type": {"DataType": "String", "StringValue": "report"}}
    trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3f"}}
    sent = client.send_message(QueueUrl=url, MessageBody="with attributes",
                               MessageAttributes=attributes, MessageSystemAttributes=trace,
                               MessageGroupId="any-group")
    assert "MD5OfMessageSystemAttributes" in sent
    [got] = client.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                                   AttributeNames=["All"])["Messages"]
    assert got["MessageAttributes"] == attributes and got["Body"] == "with attributes"
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert got["Attributes"]["AWSTraceHeader"] == trace["AWSTraceHeader"]["StringValue"]
    assert got["Attributes"]["MessageGroupId"] == "any-group"
    assert int(got["Attributes"]["ApproximateFirstReceiveTimestamp"]) >= int(
        got["Attributes"]["SentTimestamp"])
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"],
                                     VisibilityTimeout=0)
    [stored] = endpoint["admin"].queue(f"acme/{REGION}.{url.rsplit('/', 1)[1]}").peek()
    assert stored.type == "report"  # the type attribute is still rayq's type
    [again] = client.receive_message(QueueUrl=url, MessageAttributeNames=["color", "pr.*"],
                                     AttributeNames=["ApproximateFirstReceiveTimestamp",
                                                     "ApproximateReceiveCount"])["Messages"]
    assert again["MessageAttributes"] == {"color": attributes["color"]}
    assert again["Attributes"] == {"ApproximateReceiveCount": "2",
                                   "ApproximateFirstReceiveTimestamp": got["Attributes"][
                                       "ApproximateFirstReceiveTimestamp"]}


def test_a_received_message_comes_back_after_its_visibility_timeout(endpoint):
    client = sqs(endpoint)
    url = new_queue(client)
    client.send_message(QueueUrl=url, MessageBody="again")
    [first] = client.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"]
    after_first_ms = int(time.time() * 1000)
    assert client.receive_message(QueueUrl=url).get("Messages") is None  # hidden meanwhile
    [second] = eventually(lambda: client.receive_message(
        QueueUrl=url, AttributeNames=["ApproximateReceiveCount",
                                      "ApproximateFirstReceiveTimestamp"]).get("Messages"))
    assert second["Body"] == "again" and second["Attributes"]["ApproximateReceiveCount"] == "2"
    # the first receive asked for no attributes, yet its time was kept
    assert int(second["Attributes"]["ApproximateFirstReceiveTimestamp"]) <= after_first_ms
    client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])  # the older handle
    assert got_counts(client, url) == (0, 0, 0)  # deleted the message it was received again as
    client.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])  # gone: still fine


def test_a_handle_stays_valid_after_its_visibility_changes(endpoint):
    client = sqs(endpoint)
    url = new_queue(client)
    client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": str(i)} for i in range(3)])
    got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=30)[
        "Messages"]
    assert len(got) == 3
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"],
                                     VisibilityTimeout=60)
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"],
                                     VisibilityTimeout=90)  # the same handle, twice
    changed = client.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": got[1]["ReceiptHandle"], "VisibilityTimeout": 60},
        {"Id": "b", "ReceiptHandle": "bogus", "VisibilityTimeout": 60}])
    assert [e["Id"] for e in changed["Successful"]] == ["a"]
    assert [(e["Id"], e["Code"]) for e in changed["Failed"]] == [("b", "ReceiptHandleIsInvalid")]
    client.change_message_visibility(QueueUrl=url, ReceiptHandle=got[2]["ReceiptHandle"],
                                     VisibilityTimeout=0)  # back to the queue at once
    [again] = client.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    assert again["Body"] == got[2]["Body"]
    client.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    done = client.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": got[1]["ReceiptHandle"]},
        {"Id": "y", "ReceiptHandle": again["ReceiptHandle"]}])
    assert sorted(e["Id"] for e in done["Successful"]) == ["x", "y"]
    assert got_counts(client, url) == (0, 0, 0)


def test_dead_letters_land_in_any_queue_a_redrive_policy_names_and_move_back(endpoint):
    client = sqs(endpoint)
    dlq = new_queue(client)
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    url = new_queue(client)
    assert refused(client.set_queue_attributes, QueueUrl=url, Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn + "-gone",
                                     "maxReceiveCount": 2})})[0] == "InvalidParameterValue"
    client.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})})
    assert json.loads(client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])[
        "Attributes"]["RedrivePolicy"]) == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]
    client.send_message(QueueUrl=url, MessageBody="poison", MessageAttributes={
        "color": {"DataType": "String", "StringValue": "red"}})
    receives = []

    def dead_lettered():
        receives.extend(client.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages", []))
        return client.receive_message(QueueUrl=dlq, AttributeNames=["All"],
                                      MessageAttributeNames=["All"]).get("Messages")
    [dead] = eventually(dead_lettered)
    assert dead["Body"] == "poison" and len(receives) == 2
    assert dead["MessageAttributes"]["color"]["StringValue"] == "red"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"].endswith(url.rsplit("/", 1)[1])
    assert got_counts(client, url) == (0, 0, 0)
    client.change_message_visibility(QueueUrl=dlq, ReceiptHandle=dead["ReceiptHandle"],
                                     VisibilityTimeout=0)
    handle = client.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]

    def finished():
        [task] = client.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        return task if task["Status"] != "RUNNING" else None
    task = eventually(finished)  # the move runs in the background; a finished task shows no handle
    assert (task.get("TaskHandle"), task["Status"], task["ApproximateNumberOfMessagesMoved"],
            task["ApproximateNumberOfMessagesToMove"]) == (None, "COMPLETED", 1, 1)
    [back] = client.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert back["Body"] == "poison" and back["MessageAttributes"]["color"]["StringValue"] == "red"
    assert got_counts(client, dlq) == (0, 0, 0)
    assert refused(client.cancel_message_move_task, TaskHandle=handle)[0] == \
        "ResourceNotFoundException"
    client.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert client.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == []


def test_a_long_poll_returns_a_message_sent_while_it_waits(endpoint):
    client = sqs(endpoint)
    url = new_queue(client)
    out = {}
    poller = threading.Thread(target=lambda: out.update(sqs(endpoint).receive_message(
        QueueUrl=url, WaitTimeSeconds=20)))
    poller.start()
    client.send_message(QueueUrl=url, MessageBody="awaited")
    poller.join()
    assert [m["Body"] for m in out["Messages"]] == ["awaited"]


def test_tags_policies_and_permissions_are_kept_and_returned(endpoint):
    client = sqs(endpoint)
    name = f"sqs{next(_names)}"
    policy = json.dumps({"Version": "2012-10-17", "Statement": []})
    url = client.create_queue(QueueName=name, tags={"team": "a"}, Attributes={
        "Policy": policy, "KmsMasterKeyId": "alias/aws/sqs", "SqsManagedSseEnabled": "false"})[
        "QueueUrl"]
    client.tag_queue(QueueUrl=url, Tags={"env": "dev", "team": "b"})
    client.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert client.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "b"}
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (got["Policy"], got["KmsMasterKeyId"], got["KmsDataKeyReusePeriodSeconds"],
            got["SqsManagedSseEnabled"]) == (policy, "alias/aws/sqs", "300", "false")
    client.add_permission(QueueUrl=url, Label="send", AWSAccountIds=["111122223333"],
                          Actions=["SendMessage"])
    assert refused(client.add_permission, QueueUrl=url, Label="send",
                   AWSAccountIds=["111122223333"], Actions=["SendMessage"])[0] == \
        "InvalidParameterValue"
    [statement] = json.loads(client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])["Statement"]
    assert statement["Sid"] == "send" and statement["Action"] == ["SQS:SendMessage"]
    client.remove_permission(QueueUrl=url, Label="send")
    assert "Policy" not in client.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]
                                                       ).get("Attributes", {})


def test_regions_are_separate_namespaces(endpoint):
    west = sqs(endpoint)
    east = boto3_sqs(endpoint["url"], "acme", endpoint["keys"]["acme"], "us-east-1")
    west_url = west.create_queue(QueueName="regional")["QueueUrl"]
    assert refused(east.get_queue_url, QueueName="regional")[0] == "QueueDoesNotExist"
    east_url = east.create_queue(QueueName="regional", Attributes={"DelaySeconds": "3"})[
        "QueueUrl"]
    east.send_message(QueueUrl=east_url, MessageBody="east")
    assert got_counts(west, west_url) == (0, 0, 0) and got_counts(east, east_url) == (0, 0, 1)
    assert endpoint["admin"].queue("acme/regional").count() == 1  # us-east-1 is rayq's own
    assert east.list_queues(QueueNamePrefix="regional")["QueueUrls"] == [east_url]  # one, not two


def test_a_fifo_queue_keeps_group_order_and_deduplicates_across_a_shard_restart(
        endpoint, ray_session):
    client = sqs(endpoint)
    name = f"sqs{next(_names)}.fifo"
    url = client.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    got = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (got["FifoQueue"], got["ContentBasedDeduplication"]) == ("true", "false")
    assert refused(client.send_message, QueueUrl=url, MessageBody="x")[0] == "MissingParameter"
    assert refused(client.send_message, QueueUrl=url, MessageBody="x",
                   MessageGroupId="g")[0] == "InvalidParameterValue"  # no deduplication id
    first = client.send_message(QueueUrl=url, MessageBody="0", MessageGroupId="g",
                                MessageDeduplicationId="d0")
    batch = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"e{i}", "MessageBody": str(i), "MessageGroupId": "g",
         "MessageDeduplicationId": f"d{i}"} for i in range(1, 10)])["Successful"]
    sequences = [int(first["SequenceNumber"])] + [int(e["SequenceNumber"]) for e in batch]
    assert sequences == sorted(sequences) and len(set(sequences)) == 10

    ray_session.kill(ray_session.get_actor("rayq-shard-0", namespace="rayq"), no_restart=False)
    again = eventually(lambda: _sent_or_none(client, url, "0 again", "d0"))
    assert (again["MessageId"], again["SequenceNumber"]) == (first["MessageId"],
                                                              first["SequenceNumber"])
    received = []
    for _ in range(100):  # bounds a hang only: a receive right after the restart may be empty
        messages = client.receive_message(QueueUrl=url, MaxNumberOfMessages=4, WaitTimeSeconds=1,
                                          AttributeNames=["All"]).get("Messages", [])
        received += messages
        if messages:
            client.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(messages)])
        if len(received) >= 10:
            break
    assert [m["Body"] for m in received] == [str(i) for i in range(10)]  # none twice, in order
    assert [m["Attributes"]["SequenceNumber"] for m in received] == [str(s).zfill(20)
                                                                     for s in sequences]
    assert {m["Attributes"]["MessageGroupId"] for m in received} == {"g"}
    assert received[0]["Attributes"]["MessageDeduplicationId"] == "d0"


def _sent_or_none(client, url, body, dedup):
    """A FIFO send, or None while the restarted shard cannot take it yet."""
    try:
        return client.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g",
                                   MessageDeduplicationId=dedup)
    except ClientError:
        return None


def test_content_based_deduplication_drops_a_repeated_body(endpoint):
    client = sqs(endpoint)
    url = client.create_queue(QueueName=f"sqs{next(_names)}.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true",
        "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"})[
        "QueueUrl"]
    ids = [client.send_message(QueueUrl=url, MessageBody="same", MessageGroupId=group)[
        "MessageId"] for group in ("a", "a", "b")]
    assert ids[0] == ids[1] != ids[2]  # deduplicated per group
    assert got_counts(client, url) == (2, 0, 0)


# -- accounts and credentials ---------------------------------------------------------
def test_two_accounts_see_and_touch_only_their_own_queues(endpoint):
    acme, beta = sqs(endpoint), sqs(endpoint, "beta")
    acme_url = acme.create_queue(QueueName="iso-acme")["QueueUrl"]
    beta_url = beta.create_queue(QueueName="iso-beta")["QueueUrl"]
    acme.send_message(QueueUrl=acme_url, MessageBody="acme's")
    assert beta_url not in acme.list_queues()["QueueUrls"]
    assert acme_url not in beta.list_queues()["QueueUrls"]
    for call, kwargs in [(beta.receive_message, {}), (beta.purge_queue, {}),
                         (beta.send_message, {"MessageBody": "x"}), (beta.delete_queue, {}),
                         (beta.get_queue_attributes, {"AttributeNames": ["All"]})]:
        assert refused(call, QueueUrl=acme_url, **kwargs) == ("QueueDoesNotExist", 400)
    # acme's queue name in beta's namespace: not there, and nothing says acme has one
    assert refused(beta.receive_message, QueueUrl=acme_url.replace(
        account_id("acme"), account_id("beta")))[0] == "QueueDoesNotExist"
    assert refused(beta.get_queue_url, QueueName="iso-acme")[0] == "QueueDoesNotExist"
    [kept] = acme.receive_message(QueueUrl=acme_url)["Messages"]
    assert kept["Body"] == "acme's"


def test_an_akia_access_key_id_signs_for_its_account(endpoint):
    key = endpoint["keys"]["acme"]
    key_id = access_key_id("acme", key)
    assert key_id.startswith("AKIA") and len(key_id) == 20
    by_id = boto3_sqs(endpoint["url"], key_id, key, REGION)
    url = by_id.create_queue(QueueName="by-key-id")["QueueUrl"]
    assert url == sqs(endpoint).get_queue_url(QueueName="by-key-id")["QueueUrl"]  # acme's queue
    by_id.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="any-group")
    wrong = boto3_sqs(endpoint["url"], access_key_id("acme", "not-the-key"), key, REGION)
    assert refused(wrong.list_queues)[0] == "InvalidClientTokenId"


def test_two_accounts_each_have_their_own_queue_of_one_name(endpoint):
    acme, beta = sqs(endpoint), sqs(endpoint, "beta")
    acme_url = acme.create_queue(QueueName="orders-same", Attributes={"DelaySeconds": "0"})[
        "QueueUrl"]
    beta_url = beta.create_queue(QueueName="orders-same", Attributes={"DelaySeconds": "5"})[
        "QueueUrl"]
    assert (acme_url, beta_url) == (f"{endpoint['url']}/{account_id('acme')}/orders-same",
                                    f"{endpoint['url']}/{account_id('beta')}/orders-same")
    acme.send_message(QueueUrl=acme_url, MessageBody="for acme")
    beta.send_message(QueueUrl=beta_url, MessageBody="for beta")
    assert [m["Body"] for m in acme.receive_message(QueueUrl=acme_url)["Messages"]] == ["for acme"]
    assert got_counts(beta, beta_url) == (0, 0, 1)  # beta's own DelaySeconds, its own message
    assert acme.get_queue_attributes(QueueUrl=acme_url, AttributeNames=["DelaySeconds"])[
        "Attributes"] == {"DelaySeconds": "0"}


def test_the_default_account_reaches_every_accounts_queues_by_their_urls(endpoint):
    admin_key = endpoint["admin"].rotate_key(2, account="default")  # slot 2: unused so far
    admin = sqs(endpoint, "default", admin_key)
    acme = sqs(endpoint)
    url = acme.create_queue(QueueName="watched")["QueueUrl"]
    acme.send_message(QueueUrl=url, MessageBody="seen by the admin")
    assert url in admin.list_queues(QueueNamePrefix="watched")["QueueUrls"]
    assert admin.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"] == f"arn:aws:sqs:{REGION}:{account_id('acme')}:watched"
    [got] = admin.receive_message(QueueUrl=url)["Messages"]
    assert got["Body"] == "seen by the admin"
    admin.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
    assert got_counts(acme, url) == (0, 0, 0)


def raw_request(endpoint, action: str, params: dict, account="acme", key=None,
                mangle=lambda headers: None) -> requests.Response:
    """One request signed by botocore's SigV4 code, then optionally mangled."""
    body = json.dumps(params).encode()
    request = AWSRequest(method="POST", url=endpoint["url"] + "/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"})
    SigV4Auth(Credentials(account, key or endpoint["keys"][account]), "sqs", REGION).add_auth(request)
    headers = dict(request.headers.items())
    mangle(headers)
    return requests.post(request.url, data=body, headers=headers, timeout=30)


def refusal(response: requests.Response) -> tuple[int, str]:
    return response.status_code, response.json()["__type"].rsplit("#", 1)[1]


def query_request(endpoint, params: dict, path: str = "/") -> ET.Element:
    """A Query-protocol request as older SDKs send it (form body, SigV4), its XML answer."""
    body = urlencode({"Version": "2012-11-05", **params})
    request = AWSRequest(method="POST", url=endpoint["url"] + path, data=body, headers={
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    SigV4Auth(Credentials("acme", endpoint["keys"]["acme"]), "sqs", REGION).add_auth(request)
    response = requests.post(request.url, data=body, headers=dict(request.headers.items()),
                             timeout=30)
    assert response.headers["Content-Type"] == "text/xml"
    return ET.fromstring(response.content)


def test_the_query_protocol_answers_in_xml(endpoint):
    ns = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}
    created = query_request(endpoint, {"Action": "CreateQueue", "QueueName": "by-query",
                                       "Attribute.1.Name": "VisibilityTimeout",
                                       "Attribute.1.Value": "40"})
    url = created.find("q:CreateQueueResult/q:QueueUrl", ns).text
    path = "/" + url.split("/", 3)[3]
    sent = query_request(endpoint, {"Action": "SendMessage", "MessageBody": "old sdk",
                                    "MessageAttribute.1.Name": "color",
                                    "MessageAttribute.1.Value.DataType": "String",
                                    "MessageAttribute.1.Value.StringValue": "red"}, path)
    assert sent.find("q:SendMessageResult/q:MD5OfMessageBody", ns).text == md5("old sdk")
    got = query_request(endpoint, {"Action": "ReceiveMessage", "QueueUrl": url,
                                   "AttributeName.1": "All", "MessageAttributeName.1": "All"})
    message = got.find("q:ReceiveMessageResult/q:Message", ns)
    assert message.find("q:Body", ns).text == "old sdk"
    assert message.find("q:MessageAttribute/q:Value/q:StringValue", ns).text == "red"
    assert sqs(endpoint).get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])[
        "Attributes"]["VisibilityTimeout"] == "40"  # one queue, whichever protocol
    gone = query_request(endpoint, {"Action": "GetQueueUrl", "QueueName": "never-made"})
    assert gone.find("q:Error/q:Code", ns).text == "AWS.SimpleQueueService.NonExistentQueue"


def test_forged_wrong_stale_and_missing_credentials_are_refused(endpoint, monkeypatch):
    assert raw_request(endpoint, "ListQueues", {}).status_code == 200

    def forge(headers):
        auth = headers["Authorization"]
        headers["Authorization"] = auth[:-4] + ("0000" if auth[-4:] != "0000" else "1111")
    assert refusal(raw_request(endpoint, "ListQueues", {}, mangle=forge)) == (
        403, "SignatureDoesNotMatch")
    assert refusal(raw_request(endpoint, "ListQueues", {}, mangle=lambda h: h.pop(
        "Authorization"))) == (403, "MissingAuthenticationToken")
    other_key = endpoint["keys"]["beta"]
    assert refusal(raw_request(endpoint, "ListQueues", {}, key=other_key)) == (
        403, "SignatureDoesNotMatch")
    assert refusal(raw_request(endpoint, "ListQueues", {}, account="nobody", key=other_key)) == (
        403, "InvalidClientTokenId")
    stale = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) \
        - datetime.timedelta(minutes=16)
    with monkeypatch.context() as patch:
        patch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: stale)
        assert refusal(raw_request(endpoint, "ListQueues", {})) == (403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError) as info:
        sqs(endpoint, key=other_key).list_queues()
    assert code(info.value) == "SignatureDoesNotMatch"


def test_a_rotated_out_key_is_refused_and_the_new_one_works(endpoint):
    admin = endpoint["admin"]
    old = endpoint["keys"]["rot"]
    client = sqs(endpoint, "rot", old)
    url = new_queue(client)
    client.send_message(QueueUrl=url, MessageBody="before")
    new = admin.rotate_key(1, account="rot")
    assert refused(client.send_message, QueueUrl=url, MessageBody="after")[0] in (
        "SignatureDoesNotMatch", "InvalidClientTokenId")
    fresh = sqs(endpoint, "rot", new)
    fresh.send_message(QueueUrl=url, MessageBody="with the new key")
    bodies = {m["Body"] for m in fresh.receive_message(QueueUrl=url, MaxNumberOfMessages=10)[
        "Messages"]}
    assert bodies == {"before", "with the new key"}


# -- bad input ---------------------------------------------------------------------------
def test_bad_input_on_every_operation_gets_sqs_errors_and_loses_nothing(endpoint):
    client = sqs(endpoint)
    url = new_queue(client, MaximumMessageSize="1024")
    client.send_message(QueueUrl=url, MessageBody="precious")
    gone = url.rsplit("/", 1)[0] + "/never-made"
    [held] = client.receive_message(QueueUrl=url, VisibilityTimeout=600)["Messages"]
    arn = f"arn:aws:sqs:{REGION}:acme:elsewhere"
    cases = [
        (client.create_queue, {"QueueName": "bad name!"}, "InvalidParameterValue"),
        (client.create_queue, {"QueueName": "jobs.fifo", "Attributes": {"FifoQueue": "false"}},
         "InvalidParameterValue"),
        (client.create_queue, {"QueueName": "jobs", "Attributes": {"FifoQueue": "true"}},
         "InvalidParameterValue"),
        (client.create_queue, {"QueueName": "q-attrs", "Attributes": {"Policy": "not json"}},
         "InvalidAttributeValue"),
        (client.create_queue, {"QueueName": "q-attrs", "Attributes": {"Bogus": "1"}},
         "InvalidAttributeName"),
        (client.create_queue, {"QueueName": "q-attrs", "Attributes": {"DelaySeconds": "901"}},
         "InvalidAttributeValue"),
        (client.create_queue, {"QueueName": "q-attrs", "Attributes": {"RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": arn, "maxReceiveCount": 3})}}, "InvalidParameterValue"),
        (client.get_queue_url, {"QueueName": "never-made"}, "QueueDoesNotExist"),
        (client.list_queues, {"MaxResults": 0}, "InvalidParameterValue"),
        (client.delete_queue, {"QueueUrl": gone}, "QueueDoesNotExist"),
        (client.purge_queue, {"QueueUrl": gone}, "QueueDoesNotExist"),
        (client.tag_queue, {"QueueUrl": gone, "Tags": {"a": "b"}}, "QueueDoesNotExist"),
        (client.add_permission, {"QueueUrl": gone, "Label": "l", "AWSAccountIds": ["1"],
                                 "Actions": ["SendMessage"]}, "QueueDoesNotExist"),
        (client.send_message, {"QueueUrl": url + "/extra/part", "MessageBody": "x"},
         "QueueDoesNotExist"),
        (client.get_queue_attributes, {"QueueUrl": url, "AttributeNames": ["Bogus"]},
         "InvalidAttributeName"),
        (client.set_queue_attributes, {"QueueUrl": url, "Attributes": {"QueueArn": "x"}},
         "InvalidAttributeName"),
        (client.set_queue_attributes, {"QueueUrl": url, "Attributes": {"VisibilityTimeout": "-1"}},
         "InvalidAttributeValue"),
        (client.send_message, {"QueueUrl": url, "MessageBody": ""}, "MissingParameter"),
        (client.send_message, {"QueueUrl": url, "MessageBody": "x" * 1025}, "InvalidParameterValue"),
        (client.send_message, {"QueueUrl": url, "MessageBody": "nul \x00"},
         "InvalidMessageContents"),
        (client.send_message, {"QueueUrl": url, "MessageBody": "x", "DelaySeconds": 901},
         "InvalidParameterValue"),
        (client.send_message, {"QueueUrl": url, "MessageBody": "x", "MessageAttributes": {
            "color": {"DataType": "Colour", "StringValue": "red"}}}, "InvalidParameterValue"),
        (client.send_message, {"QueueUrl": gone, "MessageBody": "x"}, "QueueDoesNotExist"),
        (client.send_message_batch, {"QueueUrl": url, "Entries": []}, "EmptyBatchRequest"),
        (client.send_message_batch, {"QueueUrl": url, "Entries": [
            {"Id": str(i), "MessageBody": "x"} for i in range(11)]}, "TooManyEntriesInBatchRequest"),
        (client.send_message_batch, {"QueueUrl": url, "Entries": [
            {"Id": "a", "MessageBody": "x"}, {"Id": "a", "MessageBody": "y"}]},
         "BatchEntryIdsNotDistinct"),
        (client.send_message_batch, {"QueueUrl": url, "Entries": [
            {"Id": "a b", "MessageBody": "x"}]}, "InvalidBatchEntryId"),
        (client.send_message_batch, {"QueueUrl": url, "Entries": [
            {"Id": str(i), "MessageBody": "x" * 600_000} for i in range(2)]}, "BatchRequestTooLong"),
        (client.receive_message, {"QueueUrl": url, "MaxNumberOfMessages": 11},
         "InvalidParameterValue"),
        (client.receive_message, {"QueueUrl": url, "WaitTimeSeconds": 21}, "InvalidParameterValue"),
        (client.receive_message, {"QueueUrl": url, "VisibilityTimeout": 43_201},
         "InvalidParameterValue"),
        (client.receive_message, {"QueueUrl": url, "AttributeNames": ["Bogus"]},
         "InvalidAttributeName"),
        (client.delete_message, {"QueueUrl": url, "ReceiptHandle": "not-a-handle"},
         "ReceiptHandleIsInvalid"),
        (client.change_message_visibility, {"QueueUrl": url, "ReceiptHandle": "not-a-handle",
                                            "VisibilityTimeout": 10}, "ReceiptHandleIsInvalid"),
        (client.change_message_visibility, {"QueueUrl": url, "ReceiptHandle": held[
            "ReceiptHandle"], "VisibilityTimeout": 43_201}, "InvalidParameterValue"),
        (client.delete_message_batch, {"QueueUrl": url, "Entries": []}, "EmptyBatchRequest"),
        (client.change_message_visibility_batch, {"QueueUrl": url, "Entries": [
            {"Id": str(i), "ReceiptHandle": "x"} for i in range(11)]},
         "TooManyEntriesInBatchRequest"),
        (client.remove_permission, {"QueueUrl": url, "Label": "never-added"},
         "InvalidParameterValue"),
    ]
    for call, kwargs, expected in cases:
        try:
            got = refused(call, **kwargs)[0]
        except BaseException as err:  # pytest's "did not raise" names no case
            raise AssertionError((call.__name__, kwargs)) from err
        assert got == expected, (call.__name__, kwargs)
    partial = client.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "ok", "MessageBody": "fine"}, {"Id": "bad", "MessageBody": "x" * 1025}])
    assert [e["Id"] for e in partial["Successful"]] == ["ok"]
    assert [(e["Id"], e["Code"]) for e in partial["Failed"]] == [("bad", "InvalidParameterValue")]
    failed = client.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "bad", "ReceiptHandle": "not-a-handle"}])["Failed"]
    assert [(e["Id"], e["Code"]) for e in failed] == [("bad", "ReceiptHandleIsInvalid")]
    assert got_counts(client, url) == (1, 1, 0)  # "fine" waits; "precious" is still held
    client.delete_message(QueueUrl=url, ReceiptHandle=held["ReceiptHandle"])
    [fine] = client.receive_message(QueueUrl=url)["Messages"]
    assert fine["Body"] == "fine" and held["Body"] == "precious"


# -- serving -------------------------------------------------------------------------------
def test_serving_again_elsewhere_is_refused_while_the_endpoint_runs(endpoint):
    assert rayq.serve_sqs(port=int(endpoint["url"].rsplit(":", 1)[1])) == endpoint["url"]
    with pytest.raises(rayq.RuntimeFailure):
        rayq.serve_sqs(port=free_port())
    with pytest.raises(rayq.InvalidMessage):
        rayq.serve_sqs(port=free_port(), home_region="not a region")


def test_rayq_serve_runs_an_embedded_runtime_until_stopped(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.getcwd()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rayq.cli", "serve", "--data-dir",
                             str(tmp_path / "data"), "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}"
        stranger = boto3_sqs(url, "nobody", "x" * 44, REGION)
        assert refused(stranger.list_queues) == ("InvalidClientTokenId", 403)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0


def test_the_aws_cli_works_unchanged(endpoint, tmp_path):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "acme", "AWS_DEFAULT_REGION": REGION,
           "AWS_SECRET_ACCESS_KEY": endpoint["keys"]["acme"],
           "AWS_CONFIG_FILE": str(tmp_path / "config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials")}

    def aws(*args: str) -> dict:
        out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "aws"), "sqs", *args,
                              "--endpoint-url", endpoint["url"], "--output", "json"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if out.stdout.strip() else {}

    url = aws("create-queue", "--queue-name", "from-cli")["QueueUrl"]
    aws("send-message", "--queue-url", url, "--message-body", "sent by aws sqs")
    [got] = aws("receive-message", "--queue-url", url, "--wait-time-seconds", "5")["Messages"]
    assert got["Body"] == "sent by aws sqs"
    aws("delete-message", "--queue-url", url, "--receipt-handle", got["ReceiptHandle"])
    assert aws("get-queue-attributes", "--queue-url", url, "--attribute-names",
               "ApproximateNumberOfMessages")["Attributes"] == {"ApproximateNumberOfMessages": "0"}
    fifo = aws("create-queue", "--queue-name", "from-cli.fifo", "--attributes",
               "FifoQueue=true,ContentBasedDeduplication=true")["QueueUrl"]
    sent = [aws("send-message", "--queue-url", fifo, "--message-body", body, "--message-group-id",
                "g", "--message-attributes", '{"n": {"DataType": "Number", "StringValue": "1"}}')
            for body in ("first", "first", "second")]
    assert sent[0]["MessageId"] == sent[1]["MessageId"] != sent[2]["MessageId"]
    got = aws("receive-message", "--queue-url", fifo, "--max-number-of-messages", "10",
              "--message-attribute-names", "All", "--attribute-names", "All")["Messages"]
    assert [m["Body"] for m in got] == ["first", "second"]
    assert got[0]["MessageAttributes"]["n"]["StringValue"] == "1"
    assert got[1]["Attributes"]["SequenceNumber"] == sent[2]["SequenceNumber"]


def test_kombu_on_a_fifo_queue_delivers_in_order(endpoint):
    from urllib.parse import quote

    from kombu import Connection

    broker = f"sqs://tool:{quote(endpoint['keys']['tool'], safe='')}@{endpoint['url'][7:]}"
    options = {"region": REGION, "is_secure": False, "wait_time_seconds": 1}
    with Connection(broker, transport_options=options) as connection:
        queue = connection.SimpleQueue("kombu-jobs.fifo")
        for i in range(5):
            queue.put({"n": i})
        got = []
        for _ in range(5):
            message = queue.get(timeout=60)
            got.append(message.payload["n"])
            message.ack()
        queue.close()
    assert got == list(range(5))
    client = sqs(endpoint, "tool")
    url = client.get_queue_url(QueueName="kombu-jobs.fifo")["QueueUrl"]
    assert client.get_queue_attributes(QueueUrl=url, AttributeNames=["FifoQueue"])[
        "Attributes"] == {"FifoQueue": "true"}


CELERY_TASKS = """
import os

from celery import Celery

app = Celery("sqs_tasks", broker=os.environ["BROKER_URL"])
app.conf.broker_transport_options = {"region": "eu-west-1", "is_secure": False,
                                     "polling_interval": 0.2, "wait_time_seconds": 1}
app.conf.task_default_queue = "celery-tasks"


@app.task
def add(x, y):
    with open(os.environ["RESULT_FILE"], "a") as out:
        out.write(f"{x + y}\\n")
"""


def test_celery_with_kombus_sqs_transport_runs_tasks_unchanged(endpoint, tmp_path):
    from urllib.parse import quote

    from celery import Celery

    (tmp_path / "sqs_tasks.py").write_text(CELERY_TASKS)
    results = tmp_path / "results.txt"
    results.write_text("")
    broker = f"sqs://tool:{quote(endpoint['keys']['tool'], safe='')}@{endpoint['url'][7:]}"
    env = {**os.environ, "BROKER_URL": broker, "RESULT_FILE": str(results),
           "PYTHONPATH": str(tmp_path)}
    with open(tmp_path / "worker.log", "w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "sqs_tasks", "worker",
                                   "--pool=solo", "--without-mingle", "--without-gossip",
                                   "--without-heartbeat"], cwd=tmp_path, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        app = Celery("producer", broker=broker)
        app.conf.broker_transport_options = {"region": REGION, "is_secure": False}
        for i in range(5):
            app.send_task("sqs_tasks.add", (i, 100), queue="celery-tasks")
        eventually(lambda: len(results.read_text().split()) >= 5, timeout_s=120)
        assert sorted(results.read_text().split()) == [str(100 + i) for i in range(5)]
        client = sqs(endpoint, "tool")
        url = client.get_queue_url(QueueName="celery-tasks")["QueueUrl"]
        assert eventually(lambda: got_counts(client, url) == (0, 0, 0))  # acked: deleted
    finally:
        worker.terminate()
        worker.wait(timeout=60)
