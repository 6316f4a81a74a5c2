"""SigV4 verification of requests with query strings, against botocore's signer (the
reference implementation; the AWS test-suite vectors are not shipped with botocore):
the canonical query string sorts its pairs by key, then value, by their encoded bytes."""

import datetime

import botocore.auth
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from rayq.sqs import sigv4
from rayq.sqs.errors import SqsError

SIGNED_AT = datetime.datetime(2026, 5, 4, 12, 0, 0)
NOW = SIGNED_AT.replace(tzinfo=datetime.timezone.utc).timestamp()
HOST = "127.0.0.1:9324"
QUERIES = [
    "b=2&a=1",
    "Action=ReceiveMessage&QueueUrl=acme%2Fq&MaxNumberOfMessages=10&Version=2012-11-05",
    "a=2&a=1&a=10",               # one key repeated: ordered by value
    "x=1&A=2&_=3&a=4",           # byte order: upper case before "_" before lower case
    "j=v%20w&k=%2F&i=~",         # encoded values are taken as they were sent
    "b&a=1",                     # a key without "="
    "a=1&b=2",                   # already in order
]


def signed(monkeypatch, query: str, method: str = "GET", body: bytes = b""):
    """(the request as the endpoint sees it, botocore's canonical request for it)."""
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: SIGNED_AT)
    request = AWSRequest(method=method, url=f"http://{HOST}/acme/q?{query}", data=body,
                         headers={"X-Amz-Target": "AmazonSQS.ListQueues",  # signed, as
                                  "Content-Type": "application/x-amz-json-1.0"})  # required
    signer = SigV4Auth(Credentials("acme", "key-one"), "sqs", "eu-west-1")
    signer.add_auth(request)
    reference = signer.canonical_request(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers["host"] = HOST
    return sigv4.SignedRequest(method, "/acme/q", query, headers, body), reference


@pytest.mark.parametrize("query", QUERIES)
def test_the_canonical_request_of_a_query_is_botocores(monkeypatch, query):
    request, reference = signed(monkeypatch, query)
    names = reference.split("\n")[-2].split(";")
    assert sigv4.canonical_request(request, names) == reference


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("method, body", [("GET", b""), ("POST", b"Action=ListQueues")])
def test_a_request_with_a_query_string_botocore_signed_verifies(monkeypatch, query, method, body):
    request, _ = signed(monkeypatch, query, method, body)
    caller = sigv4.verify(request, lambda account: ["key-one"], NOW)
    assert caller == sigv4.Caller("acme", "key-one", "eu-west-1")


@pytest.mark.parametrize("query, changed", [
    ("b=2&a=1", "b=3&a=1"),
    ("a=2&a=1", "a=2&a=2"),
    ("a=1", "a=1&b=2"),
])
def test_a_query_changed_after_signing_does_not_match(monkeypatch, query, changed):
    request, _ = signed(monkeypatch, query)
    tampered = sigv4.SignedRequest(request.method, request.path, changed, request.headers,
                                   request.body)
    with pytest.raises(SqsError) as info:
        sigv4.verify(tampered, lambda account: ["key-one"], NOW)
    assert info.value.code == "SignatureDoesNotMatch"
