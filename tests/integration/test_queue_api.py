"""Every call of the public queue API on a real local Ray runtime."""

import threading

import pytest

import rayq
from tests.integration.conftest import wait_until


@pytest.mark.parametrize("body", [b"\x00raw bytes", "text é", {"a": [1, 2.5, None]}, [1, "x"], 42, True])
def test_bodies_round_trip_unchanged(queue, body):
    mid = queue.send(body, tenant="acme", type="report")
    [got] = queue.receive()
    assert (got.id, got.body, got.tenant, got.type, got.dequeue_count) == (mid, body, "acme", "report", 1)
    queue.delete(got.receipt)
    assert queue.count() == 0


def test_send_batch_keeps_order_and_receive_takes_many(queue):
    ids = queue.send_batch([rayq.Outgoing(i, tenant="t", type="k") for i in range(50)])
    got = queue.receive(max_messages=50)
    assert [m.id for m in got] == ids and [m.body for m in got] == list(range(50))
    queue.delete_batch([m.receipt for m in got])
    assert queue.count() == 0


def test_a_message_stays_hidden_for_its_timeout_then_reappears(queue):
    # how long exactly is the fake-clock contract suite's job; here: hidden, then back
    queue.send("again")
    [first] = queue.receive(visibility_timeout_s=3600)
    assert queue.receive() == [] and queue.count() == 1
    shortened = queue.change_visibility(first.receipt, 0.5)
    [second] = queue.receive(wait_s=20)  # a long poll: returns once the 0.5 s are over
    assert second.id == first.id and second.dequeue_count == 2
    for stale in (first.receipt, shortened):
        with pytest.raises(rayq.ReceiptInvalid):
            queue.delete(stale)
    queue.delete(second.receipt)


def test_receipts_are_invalid_after_delete_and_after_change_visibility(queue):
    queue.send("x")
    [m] = queue.receive()
    new = queue.change_visibility(m.receipt, 60)
    with pytest.raises(rayq.ReceiptInvalid):
        queue.delete(m.receipt)
    queue.delete(new)
    with pytest.raises(rayq.ReceiptInvalid):
        queue.delete(new)
    with pytest.raises(rayq.ReceiptInvalid):
        queue.change_visibility(new, 1)


def test_change_visibility_to_zero_makes_a_message_visible_now(queue):
    queue.send("now")
    [m] = queue.receive(visibility_timeout_s=600)
    queue.change_visibility(m.receipt, 0)
    [again] = queue.receive()
    assert again.id == m.id and again.dequeue_count == 2


@pytest.mark.parametrize("receipt", ["", "not-a-receipt", "A" * 44, "A" * 64, 17, None,
                                     "AAAAAQAAAAEABmDHBVIKEQAAAAAAAAABZmbDH_WnqwA="])
def test_forged_receipts_are_rejected_and_nothing_changes(queue, receipt):
    queue.send("keep me")
    with pytest.raises(rayq.ReceiptInvalid):
        queue.delete(receipt)
    with pytest.raises(rayq.ReceiptInvalid):
        queue.delete_batch([receipt])
    assert queue.count() == 1 and queue.peek()[0].body == "keep me"


def test_delete_batch_deletes_the_valid_and_names_the_invalid(queue):
    queue.send_batch([rayq.Outgoing(i) for i in range(3)])
    got = queue.receive(max_messages=3)
    with pytest.raises(rayq.ReceiptInvalid) as err:
        queue.delete_batch([m.receipt for m in got] + ["bogus"])
    assert err.value.receipts == ("bogus",) and queue.count() == 0


def test_a_message_received_max_receives_times_goes_to_the_dead_letter_queue(client, queue):
    queue.send("poison", tenant="t", type="bad")
    for _ in range(3):
        assert len(queue.receive(visibility_timeout_s=0, wait_s=2)) == 1
    assert queue.receive() == []
    dlq = client.queue(queue.name + "-dlq")
    [dead] = dlq.receive()
    assert dead.body == "poison" and dead.dequeue_count == 4  # 3 receives, then this one
    assert queue.count() == 0 and queue.stats().dead_letter_depth == 1


def test_peek_hides_nothing_and_has_no_receipt(queue):
    queue.send_batch([rayq.Outgoing("a"), rayq.Outgoing("b")])
    peeked = queue.peek(max_messages=5)
    assert [m.body for m in peeked] == ["a", "b"] and all(m.receipt is None for m in peeked)
    assert len(queue.receive(max_messages=5)) == 2


def test_delay_defers_first_visibility(queue):
    queue.send("next hour", delay_s=3600)
    queue.send("later", delay_s=0.5)
    assert [m.body for m in queue.receive(max_messages=10, wait_s=20)] == ["later"]
    assert queue.receive(max_messages=10) == [] and queue.count() == 2


def test_expired_messages_are_never_delivered(queue):
    queue.send("short", ttl_s=0.3)
    queue.send("long")
    wait_until(lambda: [m.body for m in queue.peek(max_messages=10)] == ["long"],
               what="the short-lived message to expire")
    assert [m.body for m in queue.receive(max_messages=10)] == ["long"]


def test_long_poll_returns_a_message_sent_while_waiting(client, queue):
    sender = threading.Timer(0.5, lambda: client.queue(queue.name).send("arrived"))
    sender.start()
    got = queue.receive(wait_s=10)
    sender.join()
    assert [m.body for m in got] == ["arrived"]


def test_count_clear_and_stats(queue):
    queue.send_batch([rayq.Outgoing(i, tenant="a", type=t) for i, t in enumerate("xxy")])
    stats = queue.stats()
    assert queue.count() == 3 and stats.depth == 3
    assert {k: v.depth for k, v in stats.keys.items()} == {"x": 2, "y": 1}
    assert all(s["state"] == "all" for s in stats.subqueues)
    queue.clear()
    assert queue.count() == 0 and queue.receive() == []


def test_queues_are_listed_created_idempotently_and_deleted(client):
    q = client.create_queue("lifecycle")
    assert client.create_queue("lifecycle").name == q.name
    assert {"lifecycle", "lifecycle-dlq"} <= set(client.list_queues())
    q.send("x")
    client.delete_queue("lifecycle")
    assert "lifecycle" not in client.list_queues() and "lifecycle-dlq" not in client.list_queues()
    with pytest.raises(rayq.QueueNotFound):
        client.queue("lifecycle")
    with pytest.raises(rayq.QueueNotFound):
        q.send("y")


@pytest.mark.parametrize("call, error", [
    (lambda q: q.send(object()), rayq.InvalidMessage),
    (lambda q: q.send(b"x" * ((16 << 20) + 1)), rayq.MessageTooLarge),
    (lambda q: q.send("x", tenant=""), rayq.InvalidMessage),
    (lambda q: q.send("x", type=3), rayq.InvalidMessage),
    (lambda q: q.send("x", delay_s=-1), rayq.InvalidMessage),
    (lambda q: q.send("x", ttl_s="1"), rayq.InvalidMessage),
    (lambda q: q.send_batch([]), rayq.InvalidMessage),
    (lambda q: q.send_batch(["not outgoing"]), rayq.InvalidMessage),
    (lambda q: q.receive(max_messages=0), rayq.InvalidMessage),
    (lambda q: q.receive(visibility_timeout_s=13 * 3600), rayq.InvalidMessage),
    (lambda q: q.receive(wait_s=-1), rayq.InvalidMessage),
    (lambda q: q.peek(max_messages="3"), rayq.InvalidMessage),
    (lambda q: q.delete_batch("abc"), rayq.InvalidMessage),
])
def test_bad_input_raises_a_documented_error_and_keeps_messages(queue, call, error):
    queue.send("survivor")
    with pytest.raises(error):
        call(queue)
    assert queue.count() == 1 and [m.body for m in queue.peek()] == ["survivor"]


@pytest.mark.parametrize("name", ["", "has space", "x" * 81, "ends-dlq", None])
def test_bad_queue_names_are_rejected(client, name):
    with pytest.raises(rayq.InvalidMessage):
        client.create_queue(name)


def test_connect_attaches_to_the_running_runtime(client, queue):
    queue.send("via connect")
    other = rayq.connect()
    assert other.queue(queue.name).count() == 1


def test_connect_works_inside_a_ray_task(ray_session, queue):
    @ray_session.remote
    def produce(name):
        import rayq as rq
        return rq.connect().queue(name).send("from a task")

    mid = ray_session.get(produce.remote(queue.name))
    assert queue.receive()[0].id == mid


def test_an_urgent_message_is_received_ahead_of_its_keys_backlog(queue):
    queue.send_batch([rayq.Outgoing(i, tenant="acme") for i in range(10)])
    queue.send("urgent", tenant="acme", priority=9)
    queue.send_batch([rayq.Outgoing("soon", tenant="acme", priority=5)])
    got = queue.receive(max_messages=12)
    assert [m.body for m in got] == ["urgent", "soon", *range(10)]
    queue.delete_batch([m.receipt for m in got])
    with pytest.raises(rayq.InvalidMessage):
        queue.send("x", priority=10)
