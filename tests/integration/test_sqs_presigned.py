"""Presigned SQS URLs: botocore presigns Query-protocol requests (SigV4QueryAuth) and
plain urllib sends them to the endpoint, which serves the valid ones and refuses the
expired, altered or doubly signed ones with SQS's errors."""

import datetime
import hashlib
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

import botocore.auth
import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from rayq.sqs.names import access_key_id

from .conftest import boto3_sqs, sqs_endpoint

REGION = "eu-west-1"
NS = {"q": "http://queue.amazonaws.com/doc/2012-11-05/"}


@pytest.fixture(scope="module")
def endpoint(ray_session, tmp_path_factory):
    with sqs_endpoint(tmp_path_factory, "sqs-presigned") as (url, keys, _):
        sqs = boto3_sqs(url, "acme", keys["acme"], REGION)
        queue_url = sqs.create_queue(QueueName="presigned")["QueueUrl"]
        yield {"url": url, "key": keys["acme"], "sqs": sqs, "queue": queue_url}


def presign(endpoint, params: dict, method="GET", expires_s=300, key_id="acme") -> str:
    """A URL botocore presigns for ``params`` (a POST's form body moves into the URL)."""
    form = method == "POST"
    request = AWSRequest(method=method, url=endpoint["queue"], data=params if form else None,
                         params={} if form else params)
    SigV4QueryAuth(Credentials(key_id, endpoint["key"]), "sqs", REGION,
                   expires=expires_s).add_auth(request)
    request.prepare()
    return request.url


def fetch(url: str, method="GET", headers=None) -> tuple[int, ET.Element]:
    """(status, XML answer) of one urllib request, error answers included."""
    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, ET.fromstring(response.read())
    except urllib.error.HTTPError as err:
        return err.code, ET.fromstring(err.read())


def error_code(answer: ET.Element) -> str:
    return answer.find("q:Error/q:Code", NS).text


def send(endpoint, body: str, **kwargs) -> str:
    return presign(endpoint, {"Action": "SendMessage", "QueueUrl": endpoint["queue"],
                              "MessageBody": body}, **kwargs)


def test_a_presigned_send_and_receive_work_over_plain_urllib(endpoint):
    body = "presigned & sent/+ é"
    status, sent = fetch(send(endpoint, body))
    assert status == 200
    assert sent.find("q:SendMessageResult/q:MD5OfMessageBody", NS).text == \
        hashlib.md5(body.encode()).hexdigest()
    receive = presign(endpoint, {"Action": "ReceiveMessage", "QueueUrl": endpoint["queue"],
                                 "WaitTimeSeconds": "5", "Version": "2012-11-05"}, method="POST")
    status, got = fetch(receive, method="POST")
    assert status == 200
    message = got.find("q:ReceiveMessageResult/q:Message", NS)
    assert message.find("q:Body", NS).text == body
    endpoint["sqs"].delete_message(QueueUrl=endpoint["queue"],
                                   ReceiptHandle=message.find("q:ReceiptHandle", NS).text)


def test_an_akia_key_id_presigns_for_its_account(endpoint):
    status, _ = fetch(send(endpoint, "by key id",
                           key_id=access_key_id("acme", endpoint["key"])))
    assert status == 200
    got = endpoint["sqs"].receive_message(QueueUrl=endpoint["queue"], WaitTimeSeconds=5)
    assert [m["Body"] for m in got["Messages"]] == ["by key id"]
    endpoint["sqs"].delete_message(QueueUrl=endpoint["queue"],
                                   ReceiptHandle=got["Messages"][0]["ReceiptHandle"])


def test_expired_altered_and_doubly_signed_urls_are_refused_and_send_nothing(
        endpoint, monkeypatch):
    two_hours_ago = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) \
        - datetime.timedelta(hours=2)
    with monkeypatch.context() as patch:
        patch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: two_hours_ago)
        expired = send(endpoint, "too late", expires_s=3600)
    status, answer = fetch(expired)
    assert (status, error_code(answer)) == (400, "RequestExpired")

    altered = send(endpoint, "original").replace("original", "altered")
    status, answer = fetch(altered)
    assert (status, error_code(answer)) == (403, "SignatureDoesNotMatch")

    url = send(endpoint, "twice")
    signed = AWSRequest(method="GET", url=url)
    SigV4Auth(Credentials("acme", endpoint["key"]), "sqs", REGION).add_auth(signed)
    status, answer = fetch(url, headers=dict(signed.headers.items()))
    assert (status, error_code(answer)) == (400, "InvalidParameterCombination")

    too_long = send(endpoint, "a week and a second", expires_s=604_801)
    status, answer = fetch(too_long)
    assert (status, error_code(answer)) == (400, "InvalidQueryParameter")

    assert "Messages" not in endpoint["sqs"].receive_message(QueueUrl=endpoint["queue"])
