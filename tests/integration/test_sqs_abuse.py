"""The SQS endpoint under abuse, with raw HTTP: it refuses before reading a body that
carries no valid claim, times out half-sent bodies, answers oversized and malformed
requests with SQS's 4xx shapes, keeps one account's long polls from starving another's
sends, and a shard never parks a receive for longer than SQS would."""

import contextlib
import hashlib
import json
import os
import select
import socket
import threading
import time
from urllib.parse import urlsplit

import boto3
import pytest
import ray
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials

import rayq
from rayq.core.codec.wire import decode_delivered
from rayq.runtime.local import free_port
from tests.certs import self_signed

from .conftest import sqs_endpoint, wait_until

REGION = "eu-west-1"
EIGHT_MIB = 8 << 20


@pytest.fixture(scope="module")
def endpoint(ray_session, tmp_path_factory):
    with sqs_endpoint(tmp_path_factory, "abuse", ("poller", "sender")) as (url, keys, admin):
        yield {"url": url, "port": urlsplit(url).port, "keys": keys, "admin": admin}


def boto(endpoint, account, pool=10):
    return boto3.client("sqs", endpoint_url=endpoint["url"], region_name=REGION,
                        aws_access_key_id=account, aws_secret_access_key=endpoint["keys"][account],
                        config=BotoConfig(retries={"max_attempts": 1}, max_pool_connections=pool,
                                          read_timeout=120))


def signed_head(endpoint, action: str, body: bytes, account="sender", length=None,
                hashed=False) -> bytes:
    """The request line and headers of a request botocore signed over ``body`` (its hash
    also in a signed X-Amz-Content-SHA256 header when ``hashed``)."""
    extra = {"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()} if hashed else {}
    request = AWSRequest(method="POST", url=endpoint["url"] + "/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}",
        **extra})
    SigV4Auth(Credentials(account, endpoint["keys"][account]), "sqs", REGION).add_auth(request)
    headers = {**dict(request.headers.items()), "Host": f"127.0.0.1:{endpoint['port']}",
               "Content-Length": str(len(body) if length is None else length)}
    return _head(headers)


def _head(headers: dict) -> bytes:
    lines = ["POST / HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def exchange(endpoint, *parts: bytes, timeout_s: float = 60.0,
             source: str = "127.0.0.1") -> tuple[int, dict]:
    """Send ``parts`` on one connection (from the address ``source``), leave it open, and
    read one answer: (status, JSON body). A socket timeout (the server never answered)
    fails the test."""
    with socket.create_connection(("127.0.0.1", endpoint["port"]),
                                  source_address=(source, 0)) as sock:
        sock.settimeout(timeout_s)
        for part in parts:
            sock.sendall(part)
        return answer_of(sock)


def answer_of(sock) -> tuple[int, dict]:
    """The one answer a connection reads: (status, JSON body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed without answering"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(int(line.split(":")[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), json.loads(rest[:length])


def shape(answer) -> tuple[int, str]:
    status, body = answer
    return status, body["__type"].rsplit("#", 1)[1]


def test_an_unsigned_request_is_refused_before_its_body_is_sent(endpoint):
    head = _head({"Host": "127.0.0.1", "Content-Type": "application/x-amz-json-1.0",
                  "X-Amz-Target": "AmazonSQS.ListQueues", "Content-Length": str(EIGHT_MIB)})
    assert shape(exchange(endpoint, head)) == (403, "MissingAuthenticationToken")


def test_an_unknown_account_is_refused_before_its_body_is_sent(endpoint):
    endpoint = {**endpoint, "keys": {**endpoint["keys"], "nobody": endpoint["keys"]["sender"]}}
    head = signed_head(endpoint, "ListQueues", b"{}", account="nobody", length=EIGHT_MIB)
    assert shape(exchange(endpoint, head)) == (403, "InvalidClientTokenId")


def replica_stats():
    from rayq.names import namespace
    from rayq.sqs.service import replica_name

    return ray.get(ray.get_actor(replica_name(0), namespace=namespace()).stats.remote())


@contextlib.contextmanager
def forged_claims(endpoint, count: int, length: int, account="sender"):
    """``count`` open connections, each sending only the head of a request that names
    ``account`` (a real one) but is signed with a key that is not its, and announces a
    ``length`` body it never sends."""
    forger = {**endpoint, "keys": {**endpoint["keys"], account: "not-" + account + "s-key"}}
    head = signed_head(forger, "ListQueues", b"{}", account=account, length=length)
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", endpoint["port"]))
            sock.settimeout(60)
            sockets.append(sock)
            sock.sendall(head)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def served_at_once(endpoint, account: str, source="127.0.0.1", hashed=False):
    """A legitimate ListQueues of ``account``, signed as botocore's SQS client signs (or
    with its body hash signed too), answered 200 on the first try."""
    body = b"{}"
    status, answer = exchange(endpoint, signed_head(endpoint, "ListQueues", body, account,
                                                    hashed=hashed), body, source=source)
    assert status == 200, answer


def test_forged_claims_holding_eight_mib_bodies_spend_nothing_shared(endpoint):
    with forged_claims(endpoint, 8, EIGHT_MIB):
        wait_until(lambda: replica_stats().unverified == 8, what="the forged heads read")
        stats = replica_stats()
        assert stats.buffered_bytes == 0 and stats.in_flight == 0
        served_at_once(endpoint, "poller")                     # another account
        served_at_once(endpoint, "sender")                     # the account named
        served_at_once(endpoint, "sender", source="127.0.0.2")  # from another host
        queue = boto(endpoint, "sender").create_queue(QueueName="unhindered")  # boto3 as is
        assert queue["QueueUrl"].endswith("/unhindered")
    wait_until(lambda: replica_stats().unverified == 0, what="the forgers gone")


def test_forged_claims_naming_an_account_never_take_its_request_slots(endpoint):
    with forged_claims(endpoint, 256, 100) as sockets:
        # Past its peer's few unverified slots, a forgery is refused at once, unread.
        answers = {}
        wait_until(lambda: len(answered(sockets, answers)) == 256 - 16, what="the refusals")
        assert set(answers.values()) == {(503, "ServiceUnavailable")}
        assert replica_stats().unverified == 16
        stats = replica_stats()
        assert stats.in_flight == 0 and stats.buffered_bytes == 0
        served_at_once(endpoint, "sender", source="127.0.0.2")
        served_at_once(endpoint, "poller", source="127.0.0.2")
        # From the forger's own address, a request that signs its body hash is checked
        # before its body is read, and needs no unverified slot.
        served_at_once(endpoint, "sender", hashed=True)
        served_at_once(endpoint, "poller", hashed=True)


def answered(sockets, answers: dict) -> dict:
    """``answers`` (socket -> (status, error code)) with those of ``sockets`` answered
    since added."""
    poll = select.poll()
    for sock in sockets:
        if sock not in answers:
            poll.register(sock, select.POLLIN)
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd, _ in poll.poll(0):
        answers[by_fd[fd]] = shape(answer_of(by_fd[fd]))
    return answers


def test_a_half_sent_body_times_out_with_a_4xx(endpoint):
    body = json.dumps({"QueueNamePrefix": "x" * 1000}).encode()
    head = signed_head(endpoint, "ListQueues", body)
    assert shape(exchange(endpoint, head, body[:len(body) // 2])) == (408, "RequestTimeout")


def test_a_body_over_the_limit_is_a_413_before_it_is_read(endpoint):
    head = signed_head(endpoint, "ListQueues", b"{}", length=EIGHT_MIB + 1)
    assert shape(exchange(endpoint, head)) == (413, "RequestEntityTooLarge")


def test_json_nested_past_the_parsers_depth_is_the_senders_400(endpoint):
    body = b"[" * 100_000 + b"]" * 100_000
    assert shape(exchange(endpoint, signed_head(endpoint, "ListQueues", body), body)) == (
        400, "SerializationException")


def test_one_accounts_long_polls_do_not_hold_up_another_accounts_send(endpoint):
    poller, sender = boto(endpoint, "poller", pool=100), boto(endpoint, "sender")
    empty = poller.create_queue(QueueName="empty")["QueueUrl"]
    target = sender.create_queue(QueueName="target")["QueueUrl"]
    polls, done = 80, []

    def poll():
        poller.receive_message(QueueUrl=empty, WaitTimeSeconds=20)
        done.append(1)
    threads = [threading.Thread(target=poll) for _ in range(polls)]
    for thread in threads:
        thread.start()
    time.sleep(3)  # let the polls reach the endpoint first (no assertion rests on this)
    sender.send_message(QueueUrl=target, MessageBody="not starved")
    finished_before_send = len(done)
    for first in range(0, polls, 10):  # a message for each poll ends it before its 20 s
        poller.send_message_batch(QueueUrl=empty, Entries=[
            {"Id": str(i), "MessageBody": "wake up"} for i in range(first, first + 10)])
    for thread in threads:
        thread.join(60)
    assert finished_before_send == 0  # the send did not wait for the polls to time out
    assert len(done) == polls


def test_a_message_sent_during_a_ten_second_long_poll_is_received_by_it(endpoint):
    client = boto(endpoint, "poller")
    url = client.create_queue(QueueName="awaited")["QueueUrl"]
    out = {}
    poller = threading.Thread(target=lambda: out.update(client.receive_message(
        QueueUrl=url, WaitTimeSeconds=10)))
    poller.start()
    time.sleep(2)  # let the poll park in the shard first (no assertion rests on this)
    boto(endpoint, "poller").send_message(QueueUrl=url, MessageBody="during the poll")
    poller.join(60)
    assert [m["Body"] for m in out.get("Messages", [])] == ["during the poll"]


def test_an_accounts_quota_is_sqs_over_limit_at_the_endpoint(endpoint):
    from botocore.exceptions import ClientError
    endpoint["keys"]["capped"] = endpoint["admin"].create_account("capped")
    endpoint["admin"].set_quota("capped", queues=1, messages=1)
    client = boto(endpoint, "capped")
    deadline = time.monotonic() + 30
    while True:  # the endpoint learns a new account's key within seconds
        try:
            url = client.create_queue(QueueName="only")["QueueUrl"]
            break
        except ClientError as err:
            if err.response["Error"]["Code"] != "InvalidClientTokenId":
                raise
            assert time.monotonic() < deadline, "the endpoint never learned the account"
            time.sleep(0.5)
    with pytest.raises(ClientError) as refused:
        client.create_queue(QueueName="second")
    assert refused.value.response["Error"]["Code"] == "OverLimit"
    client.send_message(QueueUrl=url, MessageBody="the one")
    with pytest.raises(ClientError) as full:
        client.send_message(QueueUrl=url, MessageBody="one too many")
    assert full.value.response["Error"]["Code"] == "OverLimit"


def test_a_shard_parks_a_receive_at_most_twenty_seconds_whatever_it_asks(endpoint):
    client = endpoint["admin"]
    client.create_queue("parked")
    queue, _, target = client.transport.route("parked", refresh=True)
    shard = client.transport.shard_of(queue, target)
    got = rayq.remote.call(lambda: shard.receive.remote(target, 1, 30.0, wait_s=1e9))
    assert decode_delivered(got) == []  # it came back empty: not parked for ever


def test_the_endpoint_serves_https_with_a_certificate_and_key(endpoint, tmp_path):
    from rayq.runtime.serving import stop_sqs

    cert, key = self_signed(tmp_path)
    stop_sqs()
    port = free_port()
    url = rayq.serve_sqs(port=port, tls_cert=cert, tls_key=key)
    assert url == f"https://127.0.0.1:{port}"
    client = boto3.client("sqs", endpoint_url=url, region_name=REGION, verify=cert,
                          aws_access_key_id="sender",
                          aws_secret_access_key=endpoint["keys"]["sender"],
                          config=BotoConfig(retries={"max_attempts": 1}))
    queue = client.create_queue(QueueName="over-tls")["QueueUrl"]
    assert queue.startswith(url + "/")  # queue URLs are https too (SDKs send to them)
    client.send_message(QueueUrl=queue, MessageBody="sealed")
    assert client.receive_message(QueueUrl=queue)["Messages"][0]["Body"] == "sealed"
    with pytest.raises(rayq.InvalidMessage):
        rayq.serve_sqs(port=free_port(), tls_cert=cert)  # a certificate without its key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_tls_key_other_users_may_read_is_refused_before_anything_serves(endpoint, tmp_path,
                                                                          mode):
    cert, key = self_signed(tmp_path)
    os.chmod(key, mode)
    port = free_port()
    with pytest.raises(rayq.KeyExposed, match="chmod 600"):
        rayq.serve_sqs(port=port, tls_cert=cert, tls_key=key)
    with socket.socket() as probe:  # nothing listens there
        assert probe.connect_ex(("127.0.0.1", port)) != 0
