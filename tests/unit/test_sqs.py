"""The SQS endpoint's pure parts: SigV4 verification (against botocore's signer),
queue attributes, message attributes and their MD5."""

import datetime
import hashlib
import json
import struct

import botocore.auth
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from rayq.sqs import attributes, messages, sigv4
from rayq.sqs.errors import SqsError

SIGNED_AT = datetime.datetime(2026, 5, 4, 12, 0, 0)
NOW = SIGNED_AT.replace(tzinfo=datetime.timezone.utc).timestamp()
KEYS = {"acme": ["key-one", "key-two"]}


def signed(monkeypatch, key="key-one", account="acme", service="sqs", body=b'{"QueueName":"q"}',
           url="http://127.0.0.1:9324/", unsigned=()) -> sigv4.SignedRequest:
    """A request as botocore signs it for boto3, seen the way the endpoint sees it;
    headers named in ``unsigned`` are added after signing."""
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: SIGNED_AT)
    later = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"}
    request = AWSRequest(method="POST", url=url, data=body,
                         headers={k: v for k, v in later.items() if k.lower() not in unsigned})
    SigV4Auth(Credentials(account, key), service, "eu-west-1").add_auth(request)
    if "x-amz-date" in unsigned:  # botocore adds it itself: signed, then named unsigned
        auth = request.headers["Authorization"].replace("x-amz-date;", "")
        request.headers.replace_header("Authorization", auth)
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers.update({k.lower(): v for k, v in later.items() if k.lower() in unsigned})
    headers["host"] = url.split("/")[2]
    return sigv4.SignedRequest("POST", "/", "", headers, body)


def verify(request, now=NOW):
    return sigv4.verify(request, lambda account: KEYS.get(account, []), now)


def error_of(request, now=NOW) -> tuple[str, int]:
    with pytest.raises(SqsError) as info:
        verify(request, now)
    return info.value.code, info.value.status


@pytest.mark.parametrize("key", ["key-one", "key-two"])
def test_a_request_botocore_signed_with_either_key_verifies(monkeypatch, key):
    assert verify(signed(monkeypatch, key)) == sigv4.Caller("acme", key, "eu-west-1")


@pytest.mark.parametrize("skew_s", [-899, 899])
def test_a_timestamp_within_fifteen_minutes_passes(monkeypatch, skew_s):
    assert verify(signed(monkeypatch), NOW + skew_s).account == "acme"


@pytest.mark.parametrize("skew_s", [-901, 901])
def test_a_timestamp_more_than_fifteen_minutes_off_is_refused(monkeypatch, skew_s):
    assert error_of(signed(monkeypatch), NOW + skew_s) == ("SignatureDoesNotMatch", 403)


def test_a_wrong_key_does_not_match(monkeypatch):
    assert error_of(signed(monkeypatch, key="key-three")) == ("SignatureDoesNotMatch", 403)


def test_an_unknown_account_is_an_invalid_token(monkeypatch):
    assert error_of(signed(monkeypatch, account="nobody")) == ("InvalidClientTokenId", 403)


def test_another_service_scope_is_refused(monkeypatch):
    assert error_of(signed(monkeypatch, service="s3")) == ("SignatureDoesNotMatch", 403)


@pytest.mark.parametrize("change", [
    lambda r: r.__class__(r.method, r.path, r.query, r.headers, b'{"QueueName":"other"}'),
    lambda r: r.__class__(r.method, r.path, r.query,
                          {**r.headers, "x-amz-target": "AmazonSQS.DeleteQueue"}, r.body),
    lambda r: r.__class__(r.method, "/acme/q", r.query, r.headers, r.body),
    lambda r: r.__class__(r.method, r.path, r.query,
                          {**r.headers, "host": "evil.example:9324"}, r.body),
], ids=["body", "target", "path", "host"])
def test_any_change_to_a_signed_part_breaks_the_signature(monkeypatch, change):
    assert error_of(change(signed(monkeypatch))) == ("SignatureDoesNotMatch", 403)


@pytest.mark.parametrize("name", ["x-amz-target", "content-type", "x-amz-date"])
def test_a_signature_must_cover_the_action_the_time_and_the_body_type(monkeypatch, name):
    code, status = error_of(signed(monkeypatch, unsigned=(name,)))
    assert (code, status) == ("IncompleteSignature", 400)


def test_a_query_protocol_request_has_no_target_header_to_sign(monkeypatch):
    request = signed(monkeypatch, unsigned=("x-amz-target",))
    headers = {k: v for k, v in request.headers.items() if k != "x-amz-target"}
    query = sigv4.SignedRequest("POST", "/", "", headers, request.body)  # the action: in the body
    assert verify(query).account == "acme"


def test_the_header_claim_is_refused_before_any_body_for_an_unknown_account(monkeypatch):
    headers = signed(monkeypatch, account="nobody").headers
    with pytest.raises(SqsError) as info:
        sigv4.claim(headers, lambda account: KEYS.get(account, []), NOW)
    assert info.value.code == "InvalidClientTokenId"
    assert sigv4.claim(signed(monkeypatch).headers, KEYS.get, NOW).account == "acme"


def hash_signed(monkeypatch, key="key-one", body=b'{"QueueName":"q"}') -> sigv4.SignedRequest:
    """A request whose signature covers X-Amz-Content-SHA256, the body's hash."""
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: SIGNED_AT)
    request = AWSRequest(method="POST", url="http://127.0.0.1:9324/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue",
        "X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()})
    SigV4Auth(Credentials("acme", key), "sqs", "eu-west-1").add_auth(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    headers["host"] = "127.0.0.1:9324"
    return sigv4.SignedRequest("POST", "/", "", headers, body)


def test_a_signed_body_hash_lets_the_signature_be_checked_before_the_body_is_read(monkeypatch):
    full = hash_signed(monkeypatch)
    unread = sigv4.SignedRequest("POST", "/", "", full.headers, b"")
    found = sigv4.claim(unread.headers, KEYS.get, NOW)
    payload_hash = sigv4.signed_payload_hash(unread.headers)
    assert payload_hash == hashlib.sha256(full.body).hexdigest()
    assert sigv4.verify_claim(unread, found, payload_hash).account == "acme"
    sigv4.check_payload(full.body, payload_hash)
    with pytest.raises(SqsError) as info:  # another body than the one whose hash was signed
        sigv4.check_payload(b'{"QueueName":"other"}', payload_hash)
    assert info.value.code == "SignatureDoesNotMatch"
    forged = hash_signed(monkeypatch, key="not-acmes")  # refused with no body read
    with pytest.raises(SqsError) as info:
        sigv4.verify_claim(sigv4.SignedRequest("POST", "/", "", forged.headers, b""),
                           sigv4.claim(forged.headers, KEYS.get, NOW),
                           sigv4.signed_payload_hash(forged.headers))
    assert info.value.code == "SignatureDoesNotMatch"


def test_only_a_real_hash_in_a_header_signed_request_is_a_signed_body_hash(monkeypatch):
    assert sigv4.signed_payload_hash(signed(monkeypatch).headers) is None  # botocore's SQS
    headers = dict(hash_signed(monkeypatch).headers)
    assert sigv4.signed_payload_hash({**headers, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}) \
        is None
    del headers["authorization"]  # presigned: the hash is in no signed header
    assert sigv4.signed_payload_hash(headers) is None


def test_a_request_without_authorization_misses_its_token(monkeypatch):
    request = signed(monkeypatch)
    headers = {k: v for k, v in request.headers.items() if k != "authorization"}
    bare = sigv4.SignedRequest("POST", "/", "", headers, request.body)
    assert error_of(bare) == ("MissingAuthenticationToken", 403)


@pytest.mark.parametrize("value", ["AWS4-HMAC-SHA256 Credential=acme", "Bearer xyz",
                                   "AWS4-HMAC-SHA256 Credential=acme/2026/eu/sqs/aws4_request, "
                                   "SignedHeaders=host, Signature=" + "0" * 64])
def test_a_malformed_authorization_header_is_incomplete(monkeypatch, value):
    request = signed(monkeypatch)
    mangled = sigv4.SignedRequest("POST", "/", "", {**request.headers, "authorization": value},
                                  request.body)
    assert error_of(mangled) == ("IncompleteSignature", 400)


@pytest.mark.parametrize("region", ["eu.west-1", "eu/west-1", "EU-WEST-1", ""])
def test_a_credential_scope_naming_no_region_is_incomplete(monkeypatch, region):
    request = signed(monkeypatch)  # the region is the queues' namespace: never a path or a dot
    mangled = sigv4.SignedRequest("POST", "/", "", {**request.headers, "authorization": (
        request.headers["authorization"].replace("/eu-west-1/", f"/{region}/"))}, request.body)
    assert error_of(mangled) == ("IncompleteSignature", 400)


# -- queue attributes ------------------------------------------------------------------
def parse(values: dict, base=attributes.Settings(), creating=True):
    return attributes.parse(values, base, now=5.0, creating=creating)


def test_attributes_set_the_settings_rayq_keeps_for_sqs():
    settings = parse({"VisibilityTimeout": "45", "DelaySeconds": "900",
                      "MessageRetentionPeriod": "1209600", "ReceiveMessageWaitTimeSeconds": "20",
                      "MaximumMessageSize": "1024"})
    assert settings == attributes.Settings(45, 1_209_600, 900, 20, 1024, modified_at=5.0)
    assert parse({}) == attributes.Settings()


def test_policy_encryption_and_fifo_attributes_are_kept_and_returned():
    values = {"Policy": json.dumps({"Version": "2012-10-17", "Statement": []}),
              "KmsMasterKeyId": "alias/aws/sqs", "KmsDataKeyReusePeriodSeconds": "600",
              "SqsManagedSseEnabled": "false", "FifoQueue": "true",
              "ContentBasedDeduplication": "true", "DeduplicationScope": "messageGroup",
              "FifoThroughputLimit": "perMessageGroupId"}
    settings = parse(values)
    assert settings.fifo and {k: settings.render()[k] for k in values} == values
    again = attributes.Settings.from_record(settings.to_record())
    assert again == settings and again.differs_from(settings) is None
    assert parse({"VisibilityTimeout": "31"}, settings).differs_from(settings) == \
        "VisibilityTimeout"
    assert "FifoQueue" not in attributes.Settings().render()


@pytest.mark.parametrize("values, code", [
    ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
    ({"DelaySeconds": "-1"}, "InvalidAttributeValue"),
    ({"MessageRetentionPeriod": "1209601"}, "InvalidAttributeValue"),
    ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
    ({"MaximumMessageSize": "1023"}, "InvalidAttributeValue"),
    ({"VisibilityTimeout": 30}, "InvalidAttributeValue"),
    ({"Policy": "not json"}, "InvalidAttributeValue"),
    ({"KmsDataKeyReusePeriodSeconds": "59"}, "InvalidAttributeValue"),
    ({"SqsManagedSseEnabled": "maybe"}, "InvalidAttributeValue"),
    ({"RedriveAllowPolicy": json.dumps({"redrivePermission": "byQueue"})},
     "InvalidAttributeValue"),
    ({"ContentBasedDeduplication": "true"}, "InvalidAttributeName"),  # not a FIFO queue
    ({"Bogus": "1"}, "InvalidAttributeName"),
    ({"ApproximateNumberOfMessages": "3"}, "InvalidAttributeName"),
    ({"RedrivePolicy": "not json"}, "InvalidAttributeValue"),
    ({"RedrivePolicy": json.dumps({"deadLetterTargetArn": "arn:aws:sqs:r:1:q",
                                   "maxReceiveCount": 0})}, "InvalidAttributeValue"),
    ({"RedrivePolicy": json.dumps({"maxReceiveCount": 3})}, "InvalidAttributeValue"),
])
def test_attributes_sqs_refuses_are_refused_by_name(values, code):
    with pytest.raises(SqsError) as info:
        parse(values)
    assert info.value.code == code and next(iter(values)) in info.value.message


def test_fifo_queue_is_set_only_at_creation():
    with pytest.raises(SqsError) as info:
        parse({"FifoQueue": "true"}, creating=False)
    assert info.value.code == "InvalidAttributeName"


def test_a_redrive_policy_names_any_queue_and_can_be_removed():
    policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:123456789012:anything",
                         "maxReceiveCount": "4"})
    settings = parse({"RedrivePolicy": policy})
    assert attributes.redrive_target(settings) == (
        "arn:aws:sqs:eu-west-1:123456789012:anything", 4)
    assert attributes.redrive_target(parse({"RedrivePolicy": ""}, settings)) is None


def test_a_redrive_allow_policy_says_which_sources_may_dead_letter():
    def allows(policy, source="arn:a"):
        return attributes.redrive_allows(parse({"RedriveAllowPolicy": json.dumps(policy)}), source)
    assert attributes.redrive_allows(attributes.Settings(), "arn:a")
    assert allows({"redrivePermission": "allowAll"})
    assert not allows({"redrivePermission": "denyAll"})
    assert allows({"redrivePermission": "byQueue", "sourceQueueArns": ["arn:a"]})
    assert not allows({"redrivePermission": "byQueue", "sourceQueueArns": ["arn:b"]})


# -- message attributes ---------------------------------------------------------------
ATTRIBUTES = {"color": {"DataType": "String", "StringValue": "red"},
              "price": {"DataType": "Number.float", "StringValue": "-1.5e3"},
              "blob": {"DataType": "Binary.gz", "BinaryValue": "AAEC/w=="},
              "doc": {"DataType": "String.json", "StringValue": '{"a": "é"}'},
              "type": {"DataType": "String", "StringValue": "report"}}


def test_string_number_and_binary_attributes_with_custom_types_are_kept():
    checked = messages.check_attributes(ATTRIBUTES)
    assert checked["blob"] == {"DataType": "Binary.gz", "BinaryValue": b"\x00\x01\x02\xff"}
    assert messages.rendered(checked) == ATTRIBUTES
    assert messages.message_type(checked) == "report"
    assert messages.message_type({}) == "default"


@pytest.mark.parametrize("bad", [
    {f"a{i}": {"DataType": "String", "StringValue": "x"} for i in range(11)},
    {"color": {"DataType": "Text", "StringValue": "red"}},
    {"price": {"DataType": "Number", "StringValue": "cheap"}},
    {"color": {"DataType": "String", "StringValue": ""}},
    {"blob": {"DataType": "Binary", "BinaryValue": "not base64!"}},
    {"AWS.reserved": {"DataType": "String", "StringValue": "x"}},
    {"bad..name": {"DataType": "String", "StringValue": "x"}},
    {"color": {"StringValue": "red"}},
])
def test_attributes_sqs_refuses_are_invalid_parameter_values(bad):
    with pytest.raises(SqsError) as info:
        messages.check_attributes(bad)
    assert info.value.code == "InvalidParameterValue"


@pytest.mark.parametrize("text, stored", [
    ("1" * 38, True), ("1" * 39, False), ("1" * 401, False),
    ("1" + "0" * 60 + ".000", True),           # trailing zeros are not significant
    ("0.000" + "1" * 38, True), ("-" + "9" * 38 + "e88", True),
    ("1e126", True), ("1.1e126", False), ("1e127", False), ("-1e127", False), ("1e-128", True), ("9e-129", False),
    ("1" + "0" * 200, False), ("0" * 400, True), ("0e999999", True),
])
def test_a_number_attribute_is_held_to_sqs_digits_and_range(text, stored):
    value = {"price": {"DataType": "Number", "StringValue": text}}
    if stored:
        assert messages.check_attributes(value) == value
    else:
        with pytest.raises(SqsError) as info:
            messages.check_attributes(value)
        assert info.value.code == "InvalidParameterValue"


def test_only_aws_trace_header_is_a_system_attribute():
    trace = {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988"}}
    assert messages.check_attributes(trace, system=True) == trace
    with pytest.raises(SqsError):
        messages.check_attributes({"Other": trace["AWSTraceHeader"]}, system=True)


def test_attribute_md5_matches_the_digest_sqs_returns():
    # The digest moto's SQS model (which follows SQS) gives for ATTRIBUTES.
    checked = messages.check_attributes(ATTRIBUTES)
    assert messages.attributes_md5(checked) == "a0880af1351811dc0bb7b209e7f6f23d"
    assert messages.attributes_md5(messages.rendered(checked)) == "a0880af1351811dc0bb7b209e7f6f23d"


def test_the_envelope_keeps_what_storage_does_not_and_a_bare_body_stays_bare():
    assert messages.Envelope("hi").stored() == "hi"
    assert messages.opened("hi") == messages.Envelope("hi")
    full = messages.Envelope("hi", messages.check_attributes(ATTRIBUTES), trace="Root=1",
                             group="g1", dedup="d", sequence="7", source="arn", sent_ms=5)
    assert messages.opened(full.stored()) == full
    assert messages.opened({"b": "x"}) == messages.Envelope('{"b": "x"}')


def test_attribute_names_pick_by_name_prefix_or_all():
    checked = messages.check_attributes(ATTRIBUTES)
    assert set(messages.pick_attributes(checked, ["All"])) == set(ATTRIBUTES)
    assert set(messages.pick_attributes(checked, ["color", "pr.*"])) == {"color"}
    dotted = {"price.eur": checked["price"], "price": checked["price"]}
    assert set(messages.pick_attributes(dotted, ["price.*"])) == {"price.eur"}
    assert messages.pick_attributes(checked, None) == {}


def test_attribute_md5_follows_sqs_length_prefixed_encoding():
    def framed(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data
    expected = hashlib.md5(framed(b"type") + framed(b"String") + b"\x01" + framed(b"report"))
    assert messages.attributes_md5(messages.type_attributes("report")) == expected.hexdigest()


@pytest.mark.parametrize("body, code", [("", "MissingParameter"), ("\x00", "InvalidMessageContents"),
                                        ("x" * 1025, "InvalidParameterValue")])
def test_bodies_sqs_refuses_are_refused(body, code):
    with pytest.raises(SqsError) as info:
        messages.check_body(body, 1024)
    assert info.value.code == code
