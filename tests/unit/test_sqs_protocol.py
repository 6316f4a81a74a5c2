"""The SQS JSON protocol's envelope (rayq.sqs.protocol) and the event log stand-in."""

import pytest

from rayq.analytics.eventlog import NoEventLog, log_decision
from rayq.sqs.errors import SqsError
from rayq.sqs.protocol import decode_request


@pytest.mark.parametrize("method, target, body, expected", [
    ("POST", "AmazonSQS.SendMessage", b'{"QueueUrl": "u"}', ("SendMessage", {"QueueUrl": "u"})),
    ("POST", "AmazonSQS.ListQueues", b"", ("ListQueues", {})),
])
def test_a_request_names_its_action_in_the_target_header(method, target, body, expected):
    assert decode_request(method, target, body) == expected


@pytest.mark.parametrize("method, target, body, code", [
    ("GET", "AmazonSQS.ListQueues", b"", "InvalidAction"),
    ("POST", "AmazonSNS.Publish", b"", "InvalidAction"),
    ("POST", "AmazonSQS.", b"", "InvalidAction"),
    ("POST", "", b"", "InvalidAction"),
    ("POST", "AmazonSQS.SendMessage", b"{not json", "SerializationException"),
])
def test_anything_else_is_refused_with_the_sqs_error_sdks_expect(method, target, body, code):
    with pytest.raises(SqsError) as err:
        decode_request(method, target, body)
    assert err.value.code == code


class Recorder:
    def __init__(self):
        self.appended = []

    def append(self, kind, ts, **fields):
        self.appended.append((kind, ts, fields["outcome"]))


def test_only_fairness_decisions_go_to_the_event_log():
    log = Recorder()
    log_decision(log, {"kind": "fairness", "at": 1.0, "intervening": True})
    log_decision(log, {"kind": "fairness", "at": 2.0, "intervening": False})
    log_decision(log, {"kind": "suspend", "at": 3.0, "key": "k"})
    assert log.appended == [("fairness", 1.0, "intervening"), ("fairness", 2.0, "fair")]


def test_an_event_log_that_is_off_keeps_nothing():
    log = NoEventLog()
    log.append("enqueue", 1.0, subqueue=1)
    assert (log.enabled, log.pending(), log.flush()) == (False, 0, 0)
