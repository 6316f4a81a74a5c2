"""SQS names over rayq's: account ids, regions as namespaces, names ending -dlq, ARNs;
tags and the permissions policy."""

import json

import pytest

from rayq.sqs import names, policy
from rayq.sqs.errors import SqsError
from rayq.sqs.names import QueueId


def test_an_account_id_is_twelve_digits_and_stable_per_account():
    ids = {names.account_id(a) for a in ("acme", "beta", "default")}
    assert len(ids) == 3 and all(names.is_account_id(i) for i in ids)
    assert names.account_id("acme") == names.account_id("acme")


@pytest.mark.parametrize("queue, stored", [
    (QueueId("us-east-1", "acme", "orders"), "orders"),
    (QueueId("eu-west-1", "acme", "orders"), "eu-west-1.orders"),
    (QueueId("us-east-1", "acme", "orders-dlq"), "orders-dlq.q"),
    (QueueId("eu-west-1", "acme", "x-dlq"), "eu-west-1.x-dlq.q"),
    (QueueId("us-east-1", "acme", "jobs.fifo"), "jobs.fifo"),
    (QueueId("eu-west-1", "acme", "jobs.fifo"), "eu-west-1.jobs.fifo"),
    (QueueId("eu-west-1", "acme", "q"), "eu-west-1.q"),
])
def test_each_region_is_its_own_namespace_and_dlq_names_are_escaped(queue, stored):
    assert queue.rayq_name() == stored
    assert names.from_rayq("acme", stored, queue.region) == queue
    other = "eu-west-1" if queue.region == "us-east-1" else "us-east-1"
    assert names.from_rayq("acme", stored, other) is None


def test_rayqs_own_dead_letter_queues_are_no_sqs_queue():
    assert names.from_rayq("acme", "orders-dlq", "us-east-1") is None
    assert names.from_rayq("acme", "eu-west-1.orders-dlq", "eu-west-1") is None


def test_urls_and_arns_name_the_account_by_its_id():
    queue = QueueId("eu-west-1", "acme", "orders")
    assert queue.url("http://h:1") == f"http://h:1/{names.account_id('acme')}/orders"
    assert names.parse_arn(queue.arn()) == ("eu-west-1", names.account_id("acme"), "orders")
    assert names.parse_arn("arn:aws:sqs:eu-west-1:acme") is None


@pytest.mark.parametrize("name, ok", [("a" * 80, True), ("a" * 81, False), ("a" * 75 + ".fifo", True),
                                      ("x.fifo.fifo", False), ("bad name", False)])
def test_queue_names_follow_sqs(name, ok):
    assert names.valid_name(name) is ok


def test_tags_add_replace_and_remove():
    tags = policy.tagged((), {"team": "a", "env": "dev"}, "q")
    tags = policy.tagged(tags, {"team": "b"}, "q")
    assert dict(tags) == {"team": "b", "env": "dev"}
    assert dict(policy.untagged(tags, ["env", "absent"])) == {"team": "b"}
    with pytest.raises(SqsError):
        policy.tagged(tags, {f"k{i}": "v" for i in range(50)}, "q")


def test_permissions_are_statements_of_the_queue_policy():
    arn = "arn:aws:sqs:eu-west-1:123456789012:q"
    text = policy.with_permission(None, arn, {"Label": "l1", "AWSAccountIds": ["111122223333"],
                                              "Actions": ["SendMessage"]})
    [statement] = json.loads(text)["Statement"]
    assert statement["Sid"] == "l1" and statement["Action"] == ["SQS:SendMessage"]
    assert statement["Principal"] == {"AWS": ["arn:aws:iam::111122223333:root"]}
    with pytest.raises(SqsError):  # the label exists
        policy.with_permission(text, arn, {"Label": "l1", "AWSAccountIds": ["1"],
                                           "Actions": ["SendMessage"]})
    assert policy.without_permission(text, arn, {"Label": "l1"}) == ""
    with pytest.raises(SqsError):
        policy.without_permission(text, arn, {"Label": "l2"})


def test_an_access_key_id_is_akia_shaped_and_changes_with_the_key():
    one, two = names.access_key_id("acme", "k1"), names.access_key_id("acme", "k2")
    assert one.startswith("AKIA") and len(one) == 20 and one.isalnum() and one.isupper()
    assert one != two and one == names.access_key_id("acme", "k1")
    assert one != names.access_key_id("beta", "k1")


@pytest.mark.parametrize("region, ok", [("us-east-1", True), ("eu-west-1", True),
                                        ("us-gov-west-1", True), ("x", False), ("EU-1", False),
                                        ("eu-west-1.q", False)])
def test_region_names_are_checked(region, ok):
    assert names.valid_region(region) is ok


def test_rayqs_own_dead_letter_queue_is_named_after_its_queue_in_every_region():
    from rayq.sqs.names import QueueId

    orders = QueueId("us-east-1", "acme", "orders")
    assert orders.dead_letters() == QueueId("us-east-1", "acme", "orders-dlq")
    assert orders.dead_letters().source() == orders
    assert orders.dead_letters().own_dead_letters_name() == "orders-dlq"
    assert orders.dead_letters().rayq_name() == "orders-dlq.q"  # an SQS queue of that name
    far = QueueId("eu-west-1", "acme", "jobs-dlq")
    assert far.own_dead_letters_name() == "eu-west-1.jobs-dlq"
    assert orders.source() is None and QueueId("us-east-1", "acme", "-dlq").source() is None
