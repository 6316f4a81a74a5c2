"""SQS's Query protocol: form parameters as the JSON protocol's, results and errors as XML."""

import xml.etree.ElementTree as ET
from urllib.parse import urlencode

import botocore.session
import pytest
from botocore.serialize import QuerySerializer

from rayq.sqs import protocol as query
from rayq.sqs.errors import SqsError

NS = {"q": query.NAMESPACE}


def decoded(params: dict, path="/", host="h:1"):
    return query.decode_query(urlencode(params).encode(), "", path, host)


def test_the_api_references_query_names_become_the_json_parameters():
    action, params = decoded({
        "Action": "SendMessageBatch", "Version": "2012-11-05", "QueueUrl": "http://h:1/1/q",
        "SendMessageBatchRequestEntry.1.Id": "a", "SendMessageBatchRequestEntry.1.MessageBody": "x",
        "SendMessageBatchRequestEntry.1.DelaySeconds": "5",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name": "color",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType": "String",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue": "red",
        "SendMessageBatchRequestEntry.2.Id": "b", "SendMessageBatchRequestEntry.2.MessageBody": "y"})
    assert action == "SendMessageBatch"
    assert params == {"QueueUrl": "http://h:1/1/q", "Entries": [
        {"Id": "a", "MessageBody": "x", "DelaySeconds": 5, "MessageAttributes": {
            "color": {"DataType": "String", "StringValue": "red"}}},
        {"Id": "b", "MessageBody": "y"}]}
    assert decoded({"Action": "CreateQueue", "QueueName": "q", "Attribute.1.Name": "DelaySeconds",
                    "Attribute.1.Value": "3", "Tag.1.Key": "team", "Tag.1.Value": "a"})[1] == {
        "QueueName": "q", "Attributes": {"DelaySeconds": "3"}, "tags": {"team": "a"}}
    assert decoded({"Action": "ReceiveMessage", "AttributeName.2": "SentTimestamp",
                    "AttributeName.1": "All", "MaxNumberOfMessages": "10"}, path="/1/q")[1] == {
        "AttributeNames": ["All", "SentTimestamp"], "MaxNumberOfMessages": 10,
        "QueueUrl": "http://h:1/1/q"}


@pytest.mark.parametrize("operation, params", [
    ("SendMessage", {"QueueUrl": "u", "MessageBody": "hi", "DelaySeconds": 3, "MessageAttributes": {
        "a": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}}),
    ("CreateQueue", {"QueueName": "q", "Attributes": {"VisibilityTimeout": "3"}, "tags": {"t": "v"}}),
    ("GetQueueAttributes", {"QueueUrl": "u", "AttributeNames": ["All"]}),
    ("DeleteMessageBatch", {"QueueUrl": "u", "Entries": [{"Id": "1", "ReceiptHandle": "r"}]}),
])
def test_what_botocores_query_serializer_writes_is_read_back(operation, params):
    model = botocore.session.get_session().get_service_model("sqs")
    body = QuerySerializer().serialize_to_request(params, model.operation_model(operation))["body"]
    action, got = query.decode_query(urlencode(body).encode(), "", "/", "h")
    expected = dict(params)
    if operation == "SendMessage":  # base64 on the wire, as in the JSON protocol
        expected["MessageAttributes"] = {"a": {"DataType": "Binary", "BinaryValue": "AAE="}}
    assert (action, got) == (operation, expected)


def test_results_are_sqs_xml():
    out = ET.fromstring(query.encode_query("ReceiveMessage", {"Messages": [{
        "MessageId": "m", "ReceiptHandle": "r", "MD5OfBody": "d", "Body": "<b>&",
        "Attributes": {"SentTimestamp": "1"},
        "MessageAttributes": {"c": {"DataType": "String", "StringValue": "red"}}}]}, "rid"))
    message = out.find("q:ReceiveMessageResult/q:Message", NS)
    assert message.find("q:Body", NS).text == "<b>&"
    assert message.find("q:Attribute/q:Name", NS).text == "SentTimestamp"
    assert message.find("q:MessageAttribute/q:Value/q:StringValue", NS).text == "red"
    assert out.find("q:ResponseMetadata/q:RequestId", NS).text == "rid"
    batch = ET.fromstring(query.encode_query("DeleteMessageBatch", {"Successful": [{"Id": "1"}], "Failed": [
        {"Id": "2", "SenderFault": True, "Code": "ReceiptHandleIsInvalid", "Message": "m"}]}, "r"))
    assert batch.find("q:DeleteMessageBatchResult/q:DeleteMessageBatchResultEntry/q:Id", NS).text == "1"
    assert batch.find("q:DeleteMessageBatchResult/q:BatchResultErrorEntry/q:SenderFault",
                      NS).text == "true"
    urls = ET.fromstring(query.encode_query("ListQueues", {"QueueUrls": ["a", "b"]}, "r"))
    assert [u.text for u in urls.findall("q:ListQueuesResult/q:QueueUrl", NS)] == ["a", "b"]


def test_errors_carry_the_legacy_code():
    out = ET.fromstring(query.query_error(SqsError("QueueDoesNotExist", "gone"), "rid"))
    assert out.find("q:Error/q:Code", NS).text == "AWS.SimpleQueueService.NonExistentQueue"
    assert out.find("q:Error/q:Type", NS).text == "Sender"


def test_a_request_without_an_action_is_refused():
    with pytest.raises(SqsError) as info:
        decoded({"QueueName": "q"})
    assert info.value.code == "MissingAction"
    assert query.is_query(query.FORM_TYPE + "; charset=utf-8", "", "")
    assert not query.is_query(query.FORM_TYPE, "", "AmazonSQS.SendMessage")
