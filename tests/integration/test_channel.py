"""The local channel on real Ray: a shard killed for real while sends and receives run
over its socket loses no acknowledged send and is reconnected to at its new socket;
with ``StoreConfig(local_channel=False)`` the same calls go through Ray, same results."""

import dataclasses
import itertools
import threading
from concurrent.futures import Future

import pytest
import ray

import rayq
import rayq.channel
from rayq.channel import ChannelLost
from rayq.client import Client
from rayq.core.auth.accounts import Signer
from rayq.remote import call, call_all
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.integration

_names = itertools.count()
VISIBILITY_S = 2  # a message whose receive or delete met the kill comes back this soon


def _link_of(client, queue):
    """The ShardLink of the shard that holds ``queue``'s (one) subqueue."""
    info, _, target = client.transport.route(queue.name, refresh=True)
    return client.transport.shard_of(info, target)


def _open_channel(link):
    """The link's live channel to its shard, or None."""
    channel = rayq.channel._channels.get(link._path) if link._path else None
    return channel if channel is not None and not channel.closed else None


class Traffic:
    """Senders and a receiver on threads, each send recorded once it is acknowledged."""

    def __init__(self, queue, senders: int = 2):
        self.queue, self.stop = queue, threading.Event()
        self.acked, self.received, self.errors = set(), set(), []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._guard, args=(self._send, n))
                         for n in range(senders)]
        self._threads.append(threading.Thread(target=self._guard, args=(self._receive,)))

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self._threads:
            thread.join(60)

    def _guard(self, work, *args):
        try:
            work(*args)
        except Exception as err:  # reported by the test, not lost on a thread
            self.errors.append(err)

    def _send(self, sender: int):
        for i in itertools.count():
            if self.stop.is_set():
                return
            body = f"{sender}-{i}"
            self.queue.send(body)
            with self._lock:
                self.acked.add(body)

    def _receive(self):
        while not self.stop.is_set():
            self.take(wait_s=0.2)

    def take(self, wait_s: float = 0.0) -> int:
        got = self.queue.receive(max_messages=10, visibility_timeout_s=VISIBILITY_S,
                                 wait_s=wait_s)
        with self._lock:
            self.received.update(m.body for m in got)
        if got:
            try:
                self.queue.delete_batch([m.receipt for m in got])
            except rayq.ReceiptInvalid:
                pass  # a receipt from before the kill: the message comes back, at least once
        return len(got)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return len(self.acked), len(self.received)


def _pid(link) -> int:
    return call(lambda: link.process.remote())["pid"]


def test_acknowledged_sends_survive_a_shard_kill_over_the_channel(client):
    queue = client.create_queue(f"chan{next(_names)}", max_receives=None)
    link = _link_of(client, queue)
    queue.send("first")
    first = _open_channel(link)
    assert first is not None, "the send did not go over the local channel"
    old_path, old_pid = link._path, _pid(link)

    with Traffic(queue) as traffic:
        wait_until(lambda: traffic.counts()[0] >= 20 or traffic.errors,
                   what="sends before the kill")
        ray.kill(link.handle, no_restart=False)  # a real kill; Ray restarts the shard
        wait_until(lambda: first.closed, what="the channel to the killed shard to break")
        wait_until(lambda: _pid(link) != old_pid, what="the shard to restart")
        acked_at_restart = traffic.counts()[0]
        wait_until(lambda: (traffic.counts()[0] >= acked_at_restart + 20 and _open_channel(link))
                   or traffic.errors, what="sends over the restarted shard's channel")
    assert traffic.errors == []

    # the restarted shard listens in the same folder (its restarts leave nothing
    # behind); the link holds a new connection to it
    reopened = _open_channel(link)
    assert link._path == old_path and reopened is not None and reopened is not first
    traffic.acked.add("first")
    wait_until(lambda: traffic.take() == 0 and traffic.acked <= traffic.received,
               what="every acknowledged send to be received")
    assert traffic.acked - traffic.received == set()


def _without_channel(client, signer=None) -> Client:
    """A second client on the same runtime with ``StoreConfig(local_channel=False)``."""
    config = dataclasses.replace(client.config, store=dataclasses.replace(
        client.config.store, local_channel=False))
    return Client(client.transport.manager, [link.handle for link in client.transport.shards],
                  config, signer)


class ChannelUse:
    """Counts the requests this process sends over any local channel, and its connects."""

    def __init__(self, monkeypatch):
        self.requests, self.connects = [], []
        request, connect = rayq.channel.Channel.request, rayq.channel._connect

        def counted_request(channel, method, args, kwargs):
            self.requests.append(method)
            return request(channel, method, args, kwargs)

        def counted_connect(path):
            self.connects.append(path)
            return connect(path)

        monkeypatch.setattr(rayq.channel.Channel, "request", counted_request)
        monkeypatch.setattr(rayq.channel, "_connect", counted_connect)


def _session(client, tenant: str) -> list:
    """put, receive, change_visibility, delete and delete_batch (a stale receipt among
    them) on a fresh queue; what each answered, ids and receipts left out."""
    queue = client.create_queue(f"chan{next(_names)}", max_receives=None)
    queue.send_batch([rayq.Outgoing({"n": n, "blob": b"\x00" * n}, tenant=tenant)
                      for n in range(5)])
    got = queue.receive(max_messages=5, visibility_timeout_s=30)
    renewed = queue.change_visibility(got[0].receipt, 30)
    queue.delete(renewed)
    with pytest.raises(rayq.ReceiptInvalid) as stale:
        queue.delete_batch([got[0].receipt] + [m.receipt for m in got[1:]])
    return [sorted((m.body["n"], m.body["blob"], m.tenant, m.dequeue_count) for m in got),
            isinstance(renewed, str) and renewed != got[0].receipt,
            stale.value.receipts == (got[0].receipt,), queue.count()]


@pytest.fixture(scope="module")
def account(client):
    """(name, key) of an account made for these tests."""
    name = f"chan{next(_names)}"
    return name, client.create_account(name)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_with_the_channel_off_calls_go_through_ray_with_the_same_results(
        client, account, monkeypatch, signed):
    on = rayq.connect(account=account[0], key=account[1]) if signed else client
    off = _without_channel(client, Signer(*account) if signed else None)
    tenant = account[0] if signed else "t1"  # an account sends as its own tenant only
    use = ChannelUse(monkeypatch)

    through_ray = _session(off, tenant)
    assert use.requests == [] and use.connects == []
    assert all(link._path is None for link in off.transport.shards)

    over_channel = _session(on, tenant)
    assert {"put", "receive", "change_visibility", "delete"} <= set(use.requests)
    assert over_channel == through_ray == [
        [(n, b"\x00" * n, tenant, 1) for n in range(5)], True, True, 0]


def test_call_all_issues_again_a_call_whose_channel_broke_as_it_was_sent():
    issued = []

    def make():
        issued.append("again" if issued else "first")
        if len(issued) == 1:
            raise ChannelLost("the socket broke under sendall")
        answered = Future()
        answered.set_result("answered")
        return answered

    assert call_all([make]) == ["answered"] and issued == ["first", "again"]


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_client_on_another_host_calls_over_keyed_tcp_with_the_same_results(
        client, account, monkeypatch, signed):
    """On one machine the shards' host is this one: the client says it is elsewhere, so
    the shards answer with their TCP address (127.0.0.1 here) and key."""
    off = _without_channel(client, Signer(*account) if signed else None)
    tenant = account[0] if signed else "t1"
    through_ray = _session(off, tenant)
    monkeypatch.setattr(rayq.channel, "host_id", lambda: "another-host/boot")
    far = Client(client.transport.manager, [link.handle for link in client.transport.shards],
                 client.config, Signer(*account) if signed else None)
    use = ChannelUse(monkeypatch)
    assert _session(far, tenant) == through_ray  # Ray carries calls while TCP opens aside
    links = list(far.transport.shards)
    wait_until(lambda: all(link._channel() is not None for link in links),  # asks, opens
               what="a TCP channel to every shard")
    assert use.connects and all(address[0] == "tcp" and address[1] == "127.0.0.1"
                                and len(address[3]) == 32 for address in use.connects)
    use.requests.clear()
    assert _session(far, tenant) == through_ray
    assert {"put", "receive", "change_visibility", "delete"} <= set(use.requests)
