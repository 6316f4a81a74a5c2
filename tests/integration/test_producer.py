"""rayq.connect's clients share a transport per address, account and key: a client per
thread sends through the same producer as the others, clients with different keys
never share one, and a restarted runtime gets a fresh one."""

import gc
import threading
import weakref

import rayq
from rayq.core.codec.model import receipt_subqueue
from tests.integration.conftest import start_runtime

THREADS = 8
SENDS = 25


def test_clients_connected_with_the_same_credentials_share_one_producer(client):
    client.create_queue("shared-sends")
    first, second = rayq.connect(), rayq.connect()
    assert first.transport is second.transport
    assert first.transport.producer("shared-sends") is second.transport.producer("shared-sends")


def test_a_client_per_thread_sends_every_message_once(client):
    queue = client.create_queue("per-thread-sends")
    ids: dict[int, list[str]] = {}

    def sender(n: int) -> None:
        mine = rayq.connect().queue("per-thread-sends")
        ids[n] = [mine.send(f"{n}.{i}") for i in range(SENDS)]

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    sent = [mid for n in range(THREADS) for mid in ids[n]]
    assert len(set(sent)) == THREADS * SENDS
    assert queue.count() == THREADS * SENDS
    bodies = {m.body for m in queue.peek(max_messages=THREADS * SENDS)}
    assert bodies == {f"{n}.{i}" for n in range(THREADS) for i in range(SENDS)}


def test_each_senders_batch_and_single_sends_land_on_one_subqueue(client):
    client.create_queue("affine", subqueues=2)
    landed: dict[int, set[int]] = {}

    def sender(n: int) -> None:
        queue = rayq.connect().queue("affine")
        queue.send_batch([rayq.Outgoing(f"{n}.batch.{i}") for i in range(100)])
        for i in range(5):
            queue.send(f"{n}.single.{i}")

    for n in range(3):  # one after another, each on a thread of its own
        thread = threading.Thread(target=sender, args=(n,))
        thread.start()
        thread.join(120)
    queue = client.queue("affine")
    while got := queue.receive(max_messages=100):
        for m in got:
            landed.setdefault(int(m.body.split(".")[0]), set()).add(receipt_subqueue(m.receipt))
        queue.delete_batch([m.receipt for m in got])
    assert sorted(landed) == [0, 1, 2]
    assert all(len(subqueues) == 1 for subqueues in landed.values()), landed


def test_clients_with_different_keys_never_share_a_transport(client):
    first_key = client.create_account("keyed")
    second_key = client.rotate_key(2, account="keyed")
    other_key = client.create_account("other")
    first = rayq.connect(account="keyed", key=first_key)
    again = rayq.connect(account="keyed", key=first_key)
    second = rayq.connect(account="keyed", key=second_key)
    other = rayq.connect(account="other", key=other_key)
    unsigned = rayq.connect()
    assert first.transport is again.transport
    transports = [first.transport, second.transport, other.transport, unsigned.transport]
    assert len({id(t) for t in transports}) == len(transports)
    queue = first.create_queue("keyed-jobs")
    queue.send("by the first key")
    second.queue("keyed-jobs").send("by the second key")
    assert queue.count() == 2
    client.rotate_key(1, account="keyed")  # the first key is refused from now on
    try:
        queue.send("refused")
    except rayq.AuthError:
        pass
    else:
        raise AssertionError("a send signed with a rotated-out key was accepted")
    assert second.queue("keyed-jobs").send("the second key still works")


def test_a_transport_no_client_holds_is_freed(client):
    held = weakref.ref(rayq.connect(account="freed", key=client.create_account("freed")).transport)
    gc.collect()
    assert held() is None


def test_a_restarted_runtime_gets_a_new_transport(client, tmp_path_factory):
    before = rayq.connect()
    restarted, _ = start_runtime(tmp_path_factory)
    after = rayq.connect()
    assert after.transport is not before.transport
    queue = restarted.create_queue("after-restart")
    after.queue("after-restart").send("through the new runtime")
    assert queue.count() == 1
