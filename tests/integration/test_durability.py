"""Acknowledged messages survive a killed shard and a full runtime restart."""

import threading
import time


import rayq
from tests.integration.conftest import start_runtime, wait_until


def drain(queue, deadline_s=40.0):
    """Receive and delete until the queue is empty (hidden messages come back first)."""
    seen = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        got = queue.receive(max_messages=200, visibility_timeout_s=2, wait_s=0.5)
        seen += [m.id for m in got]
        if got:
            try:
                queue.delete_batch([m.receipt for m in got])
            except rayq.ReceiptInvalid:
                pass
        elif queue.count() == 0:
            break
    return seen


def test_killing_a_shard_mid_stream_loses_no_acknowledged_message(ray_session, tmp_path_factory):
    client, _ = start_runtime(tmp_path_factory, rayq.Config(store=rayq.StoreConfig(shards=1)))
    client.create_queue("stream", max_receives=None)
    acked, received, stop = [], [], threading.Event()

    def produce():
        q, i = rayq.connect().queue("stream"), 0
        while not stop.is_set():
            acked.extend(q.send_batch([rayq.Outgoing(i + j) for j in range(20)]))
            i += 20

    def consume():
        q = rayq.connect().queue("stream")
        while not stop.is_set():
            got = q.receive(max_messages=50, visibility_timeout_s=3, wait_s=0.2)
            received.extend(m.id for m in got)
            try:
                q.delete_batch([m.receipt for m in got]) if got else None
            except rayq.ReceiptInvalid:
                pass  # the reply of a delete was lost in the kill: the message comes back

    workers = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for w in workers:
        w.start()
    try:
        wait_until(lambda: len(acked) >= 200 and received, what="the stream to be under way")
        ray_session.kill(ray_session.get_actor("rayq-shard-0", namespace="rayq"), no_restart=False)
        killed_at = len(acked), len(received)
        wait_until(lambda: len(acked) >= killed_at[0] + 200 and len(received) > killed_at[1],
                   what="sends and receives to go on through the restarted shard")
    finally:
        stop.set()
        for w in workers:
            w.join()
    received += drain(client.queue("stream"))
    assert len(acked) > 100
    assert set(acked) <= set(received), f"{len(set(acked) - set(received))} acknowledged messages lost"


def receive_all_visible(queue) -> set[str]:
    """Receive (hiding for an hour) every message visible now; their ids."""
    seen: set[str] = set()
    while got := queue.receive(max_messages=200, visibility_timeout_s=3600):
        seen.update(m.id for m in got)
    return seen


def test_a_full_shutdown_and_start_keeps_every_message_and_its_hidden_state(
        ray_session, tmp_path_factory):
    client, data_dir = start_runtime(tmp_path_factory)
    queue = client.create_queue("durable", subqueues=2)
    ids = queue.send_batch([rayq.Outgoing(i, tenant="t", type="k") for i in range(100)])
    hidden = queue.receive(max_messages=10, visibility_timeout_s=3600)
    assert len(hidden) == 10
    rayq.shutdown()
    rayq.shutdown()  # idempotent

    client = rayq.start(data_dir=data_dir)
    queue = client.queue("durable")
    assert queue.count() == 100
    hidden_ids = {m.id for m in hidden}
    assert receive_all_visible(queue) == set(ids) - hidden_ids  # in flight stays in flight
    for m in hidden:  # their receipts outlive the restart: show them again
        queue.change_visibility(m.receipt, 0)
    assert receive_all_visible(queue) == hidden_ids
