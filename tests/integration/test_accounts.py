"""Accounts on real Ray: signed clients, and forged, expired, replayed and cross-account
requests refused with AuthError while the stored messages stay exactly as they were."""

import dataclasses
import gc
import time
import weakref

import pytest
import ray

import rayq
import rayq.remote
from rayq.core.auth.accounts import Signer, Verifier
from rayq.core.auth.operations import SHARD_OPS
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.codec.wire import encode_messages

pytestmark = pytest.mark.integration


@rayq.task(type="greet")
def greet(name):
    return f"hello {name}"


@pytest.fixture(scope="module")
def accounts(client):
    """Two accounts with a queue each, plus their signed clients and keys."""
    keys = {name: client.create_account(name) for name in ("acme", "globex")}
    clients = {name: rayq.connect(account=name, key=key) for name, key in keys.items()}
    for name, signed in clients.items():
        signed.create_queue(f"{name}-jobs", max_receives=3)
    return clients, keys


def _put_target(client, queue_name):
    """(shard link, subqueue) a client puts to: for calling the shard directly, as a
    hand-rolled client would."""
    queue, _, target = client.transport.route(queue_name, refresh=True)
    return client.transport.shard_of(queue, target), target


def _stored(admin, name) -> list:
    """Every visible message of a queue as the admin sees it: (id, body, tenant)."""
    return sorted((m.id, m.body, m.tenant) for m in admin.queue(name).peek(max_messages=100))


def test_connect_checks_credentials(client, accounts):
    clients, keys = accounts
    assert clients["acme"].whoami() == "acme" and client.whoami() == "default"
    with pytest.raises(rayq.AuthError):
        rayq.connect(account="acme", key=keys["globex"])  # someone else's key
    with pytest.raises(rayq.AuthError):
        rayq.connect(account="acme", key="not-a-key")
    with pytest.raises(rayq.AuthError):
        rayq.connect(account="acme")


def test_an_account_sees_and_uses_only_its_own_queues(client, accounts):
    clients, _ = accounts
    acme, globex = clients["acme"], clients["globex"]
    q = acme.queue("acme-jobs")
    mid = q.send({"n": 1})
    [got] = q.receive(visibility_timeout_s=30)
    assert (got.id, got.tenant, got.body) == (mid, "acme", {"n": 1})
    q.delete(got.receipt)
    assert q.count() == 0 and q.stats().depth == 0
    assert [n for n in acme.list_queues() if not n.startswith("acme")] == []
    assert {"acme/acme-jobs", "globex/globex-jobs"} <= set(client.list_queues())  # the admin's
    for attempt in (lambda: globex.queue("acme-jobs"), lambda: globex.delete_queue("acme-jobs"),
                    lambda: globex.queue("acme/acme-jobs")):
        with pytest.raises(rayq.QueueNotFound):
            attempt()
    assert "acme/acme-jobs" in client.list_queues() and q.count() == 0


def test_an_account_sends_only_as_itself(client, accounts):
    clients, _ = accounts
    q = clients["acme"].queue("acme-jobs")
    before = _stored(client, "acme/acme-jobs")
    with pytest.raises(rayq.AuthError):
        q.send("pretending", tenant="globex")
    with pytest.raises(rayq.AuthError):
        q.send_batch([rayq.Outgoing("mine"), rayq.Outgoing("not mine", tenant="globex")])
    assert _stored(client, "acme/acme-jobs") == before


def test_forged_expired_and_replayed_requests_change_nothing(client, accounts):
    clients, keys = accounts
    acme = clients["acme"]
    acme.queue("acme-jobs").send("kept")
    before = _stored(client, "acme/acme-jobs")
    shard, target = _put_target(acme, "acme-jobs")
    messages = encode_messages([NewMessage(encode_body("sneaked", 1 << 20), "acme", "default",
                                           "default")])
    good = Signer("acme", keys["acme"])
    put = SHARD_OPS["put"]
    forged = dataclasses.replace(good.sign(put, target, messages, queue="acme-jobs"), mac="0" * 64)
    stale = Signer("acme", keys["acme"], clock=lambda: time.time() - 16 * 60)
    wrong_body = good.sign(put, target, messages[:0], queue="acme-jobs")
    for auth in (forged, stale.sign(put, target, messages, queue="acme-jobs"), wrong_body):
        with pytest.raises(rayq.AuthError):
            rayq.remote.call(lambda a=auth: shard.put.remote(target, messages, auth=a))
    assert _stored(client, "acme/acme-jobs") == before

    once = good.sign(put, target, messages, queue="acme-jobs")
    rayq.remote.call(lambda: shard.put.remote(target, messages, auth=once))
    with pytest.raises(rayq.AuthError, match="replayed"):
        rayq.remote.call(lambda: shard.put.remote(target, messages, auth=once))
    after = _stored(client, "acme/acme-jobs")
    assert len(after) == len(before) + 1 and [b for _, b, _ in after].count("sneaked") == 1


def test_cross_account_requests_are_refused_and_change_nothing(client, accounts):
    clients, keys = accounts
    acme = clients["acme"]
    q = acme.queue("acme-jobs")
    q.clear()
    q.send("private")
    [held] = q.receive(visibility_timeout_s=60)
    mallory = Signer("globex", keys["globex"])
    shard, target = _put_target(acme, "acme-jobs")
    # globex signs its own requests genuinely, but names acme's queue or subqueues
    attempts = [
        ("receive", (target, 10, 30), {"max_receives": 3, "wait_s": 0.0}),
        ("delete", ([held.receipt],), {}),
        ("change_visibility", (held.receipt, 0), {}),
        ("peek", (target, 10), {}),
        ("clear", (target,), {}),
        ("counts", ([target],), {}),
    ]
    for queue_name in ("acme-jobs", "globex-jobs"):
        for method, args, kwargs in attempts:
            auth = mallory.sign(SHARD_OPS[method], *args, queue=queue_name, **kwargs)
            make = (lambda a, m=method, args=args, kwargs=kwargs:
                    getattr(shard, m).remote(*args, auth=a, **kwargs))
            with pytest.raises(rayq.AuthError):
                rayq.remote.call(lambda make=make, auth=auth: make(auth))
    assert q.count() == 1
    q.delete(held.receipt)  # acme's receipt is still the valid one
    assert q.count() == 0


def test_admin_operations_are_refused_to_accounts(accounts):
    globex = accounts[0]["globex"]
    for attempt in (globex.fairness, globex.flooders, globex.flood_events, globex.task_stats,
                    globex.flush_events, globex.stats, lambda: globex.scale_consumers(3),
                    lambda: globex.create_account("initech"),
                    lambda: globex.rotate_key(1, account="acme"),
                    lambda: globex.suspend("greet", reason="x", by="globex")):
        with pytest.raises(rayq.AuthError):
            attempt()


def test_accounts_submit_tasks_as_themselves(client, accounts):
    clients, _ = accounts
    client.register(greet)
    acme = clients["acme"]
    assert ray.get(acme.submit(greet, "acme"), timeout=60) == "hello acme"
    with pytest.raises(rayq.AuthError):
        acme.submit(greet, "x", tenant="globex")
    with pytest.raises(rayq.AuthError):  # a task queue takes submissions, not receives
        acme.queue("default/tasks").receive()
    with pytest.raises(rayq.QueueNotFound):  # a plain name is of acme's own namespace
        acme.queue("tasks")


def test_an_account_cannot_register_handlers(accounts):
    @rayq.task(type="sneaky")
    def sneaky():
        return "ran inside the runtime"

    with pytest.raises(rayq.AuthError):
        accounts[0]["acme"].submit(sneaky)


def test_a_rotated_key_is_refused_and_the_other_keeps_working(client):
    first = client.create_account("rotor")
    user = rayq.connect(account="rotor", key=first)
    q = user.create_queue("rotor-jobs")
    q.send("before")
    with pytest.raises(rayq.AuthError):  # a leaked key must not replace the other one
        user.rotate_key(2)
    new = client.rotate_key(1, account="rotor")
    for refused in (q.count, user.list_queues):  # shards and manager refuse the old key at once
        with pytest.raises(rayq.AuthError):
            refused()
    second = client.rotate_key(2, account="rotor")
    for key in (new, second):
        assert rayq.connect(account="rotor", key=key).queue("rotor-jobs").count() == 1


def test_an_account_cannot_rekey_its_messages_or_squat_a_task_queue(client, accounts):
    clients, keys = accounts
    acme = clients["acme"]
    acme.submit(greet, "warm")  # the shared task queue exists
    shard, target = _put_target(acme, "default/tasks")  # the default account's, shared
    before = _stored(client, "tasks")
    # keyed "x" instead of the runtime's key: would dodge a suspension of "report" on a
    # queue acme shares (on a plain queue of its own, a key of its choosing is its group)
    dodging = encode_messages([NewMessage(encode_body("m", 1 << 20), "acme", "report", "x")])
    auth = Signer("acme", keys["acme"]).sign(SHARD_OPS["put"], target, dodging,
                                             queue="default/tasks")
    with pytest.raises(rayq.AuthError, match="fairness key"):
        rayq.remote.call(lambda: shard.put.remote(target, dodging, auth=auth))
    assert _stored(client, "tasks") == before

    acme.create_queue("acme-squat").send("acme's own")  # made before an admin puts tasks there

    @rayq.task(type="squatted", queue="acme-squat")
    def squatted():
        return "ran"

    # the task queue is the default account's own acme-squat: acme's is another queue
    client.register(squatted)
    assert ray.get(acme.submit(squatted), timeout=60) == "ran"
    assert [m.body for m in acme.queue("acme-squat").peek(max_messages=10)] == ["acme's own"]
    assert {"acme-squat", "acme/acme-squat"} <= set(client.list_queues())


def test_two_accounts_each_have_their_own_queue_of_one_name(client, accounts):
    clients, _ = accounts
    acme, globex = clients["acme"], clients["globex"]
    mine, theirs = (c.create_queue("orders", max_receives=1) for c in (acme, globex))
    mine.send("for acme")
    theirs.send_batch([rayq.Outgoing("for globex"), rayq.Outgoing("again")])
    assert (mine.count(), theirs.count()) == (1, 2)
    assert [m.body for m in mine.peek(max_messages=10)] == ["for acme"]
    assert mine.stats().depth == 1 and theirs.stats().depth == 2
    assert {"orders", "orders-dlq"} <= set(acme.list_queues())
    assert not any("/" in n for n in acme.list_queues())
    assert {"acme/orders", "globex/orders", "acme/orders-dlq"} <= set(client.list_queues())
    assert client.queue("acme/orders").count() == 1  # the admin names any account's queue
    by_name = {}
    for shard in client.stats():
        for name, n in shard.queues.items():
            by_name[name] = by_name.get(name, 0) + n
    assert by_name["acme/orders"] == 1 and by_name["globex/orders"] == 2

    # a dead letter stays in its account: acme's orders-dlq, not globex's
    [got] = mine.receive(visibility_timeout_s=0)
    deadline = time.monotonic() + 30
    while acme.queue("orders-dlq").count() == 0 and time.monotonic() < deadline:
        assert mine.receive(visibility_timeout_s=0) == []
    assert acme.queue("orders-dlq").count() == 1 and globex.queue("orders-dlq").count() == 0
    assert mine.stats().dead_letter_depth == 1 and theirs.stats().dead_letter_depth == 0


def test_a_queue_the_admin_makes_and_fills_counts_in_the_stats_at_once(client):
    # unsigned puts never make a shard's gate fetch the directory: its statistics do
    queue = client.create_queue("stats-at-once")
    queue.send_batch([rayq.Outgoing(i) for i in range(3)])
    assert sum(shard.queues.get("stats-at-once", 0) for shard in client.stats()) == 3


def test_another_accounts_queue_names_do_not_leak(accounts):
    clients, _ = accounts
    clients["acme"].create_queue("secret-plans")
    globex = clients["globex"]
    errors = []
    for name in ("secret-plans", "no-such-queue"):
        with pytest.raises(rayq.QueueNotFound) as err:
            globex.queue(name)
        errors.append(str(err.value).replace(name, "<name>"))
        with pytest.raises(rayq.QueueNotFound):
            globex.delete_queue(name)
    assert errors[0] == errors[1]  # an existing queue of acme reads as a missing one
    assert "secret-plans" not in globex.list_queues()
    with pytest.raises(rayq.AuthError):  # no account creates in another's namespace
        globex.create_queue("acme/sneaky")
    assert clients["acme"].queue("secret-plans").count() == 0


def test_two_clients_of_one_account_each_sign_their_own_sends(client, monkeypatch):
    first = client.create_account("pair")
    old = rayq.connect(account="pair", key=first)
    old_queue = old.create_queue("pair-jobs")
    old_queue.send("sent by the old client")
    second = client.rotate_key(1, account="pair")
    new = rayq.connect(account="pair", key=second)
    signed = []  # (signature, signed arguments) of every request the new client makes
    sign, put = new.transport.sign, SHARD_OPS["put"]
    monkeypatch.setattr(new.transport, "sign",
                        lambda op, *args, **kwargs: signed.append(
                            (sign(op, *args, **kwargs), op.bind(*args, **{
                                k: v for k, v in kwargs.items() if k != "queue"})))
                        or signed[-1][0])
    new.queue("pair-jobs").send("sent by the new client")
    puts = [(sig, args) for sig, args in signed if sig.operation == put.name]
    assert len(puts) == 1
    sig, arguments = puts[0]
    body = put.body(arguments)
    assert Verifier(lambda account: [second]).verify(sig, "pair-jobs", put.name, body,
                                                     time.time()) == "pair"
    with pytest.raises(rayq.AuthError):  # not made with the rotated-out key
        Verifier(lambda account: [first]).verify(sig, "pair-jobs", put.name, body, time.time())
    with pytest.raises(rayq.AuthError):  # the old client's key is refused once rotated out
        old_queue.send("refused")
    assert sorted(m.body for m in new.queue("pair-jobs").peek(max_messages=10)) == [
        "sent by the new client", "sent by the old client"]

    dropped = weakref.ref(old.transport)
    del old, old_queue
    gc.collect()
    assert dropped() is None  # nothing process-wide keeps a client's transport alive


def test_requests_replayed_after_a_shard_restart_are_refused(client, accounts):
    clients, keys = accounts
    shard, target = _put_target(clients["acme"], "acme-jobs")
    messages = encode_messages([NewMessage(encode_body("captured", 1 << 20), "acme", "default",
                                           "default")])
    signer = Signer("acme", keys["acme"])
    put = signer.sign(SHARD_OPS["put"], target, messages, queue="acme-jobs")
    read = signer.sign(SHARD_OPS["counts"], [target], queue="acme-jobs")
    rayq.remote.call(lambda: shard.put.remote(target, messages, auth=put))
    counted = rayq.remote.call(lambda: shard.counts.remote([target], auth=read))
    sqs_read = signer.sign(SHARD_OPS["visibility_counts"], [target], queue="acme-jobs")  # every signed read
    rayq.remote.call(lambda: shard.visibility_counts.remote([target], auth=sqs_read))
    before = rayq.remote.call(lambda: shard.process.remote())["pid"]

    ray.kill(shard.handle, no_restart=False)  # a real kill; Ray restarts the shard
    deadline = time.monotonic() + 60
    while rayq.remote.call(lambda: shard.process.remote())["pid"] == before:
        assert time.monotonic() < deadline, "the shard did not restart"

    with pytest.raises(rayq.AuthError, match="replayed"):
        rayq.remote.call(lambda: shard.put.remote(target, messages, auth=put))
    with pytest.raises(rayq.AuthError, match="replayed"):
        rayq.remote.call(lambda: shard.counts.remote([target], auth=read))
    with pytest.raises(rayq.AuthError, match="replayed"):
        rayq.remote.call(lambda: shard.visibility_counts.remote([target], auth=sqs_read))
    stored = [body for _, body, _ in _stored(client, "acme/acme-jobs")]
    assert stored.count("captured") == 1  # stored exactly once
    fresh = signer.sign(SHARD_OPS["counts"], [target], queue="acme-jobs")  # the shard serves new requests
    assert rayq.remote.call(lambda: shard.counts.remote([target], auth=fresh)) == counted


def test_a_client_whose_own_request_comes_back_as_a_replay_signs_it_anew(client, accounts,
                                                                         monkeypatch):
    """What Ray's re-delivery of a call across a shard restart looks like to a client: its
    request, with its stored nonce, arrives again. The client signs anew, once."""
    acme = accounts[0]["acme"]
    q = acme.queue("acme-jobs")
    q.clear()
    shard, target = _put_target(acme, "acme-jobs")
    messages = encode_messages([NewMessage(encode_body("twice", 1 << 20), "acme", "default",
                                           "default")])
    put = SHARD_OPS["put"]
    delivered = acme.transport.sign(put, target, messages, queue="acme-jobs")
    rayq.remote.call(lambda: shard.put.remote(target, messages, auth=delivered))
    sign, signed = acme.transport.sign, []

    def redeliver_first(operation, *args, **kwargs):
        signed.append(delivered if not signed else sign(operation, *args, **kwargs))
        return signed[-1]

    monkeypatch.setattr(acme.transport, "sign", redeliver_first)
    ids = acme.transport.call(put, shard, target, messages, queue="acme-jobs")
    assert len(ids) == 1 and len(signed) == 2 and signed[1].nonce != delivered.nonce
    assert q.count() == 2  # at least once: the re-delivered put is stored again


def test_an_accounts_quota_refuses_queues_and_sends_past_it_and_deletes_make_room(client):
    quoted = rayq.connect(account="quoted", key=client.create_account("quoted"))
    quota = client.set_quota("quoted", queues=2, messages=3)
    assert (quota.queues, quota.messages, quota.bytes) == (2, 3, None)
    with pytest.raises(rayq.AuthError):
        quoted.set_quota("quoted")  # the admin's alone
    first = quoted.create_queue("q1")
    quoted.create_queue("q2")
    quoted.create_queue("q2")  # idempotent: not one more queue
    with pytest.raises(rayq.QuotaExceeded):
        quoted.create_queue("q3")
    ids = first.send_batch([rayq.Outgoing(f"m{i}") for i in range(3)])  # one put: exact
    with pytest.raises(rayq.QuotaExceeded):
        first.send("one too many")
    assert sorted(m.body for m in client.queue("quoted/q1").peek(max_messages=10)) == [
        "m0", "m1", "m2"]  # the refusal lost nothing
    got = first.receive(max_messages=3)
    assert len(got) == 3 and len(ids) == 3
    first.delete_batch([m.receipt for m in got])
    deadline = time.monotonic() + 60  # the manager counts every second; a refusal refetches
    while True:
        try:
            first.send("room again")
            break
        except rayq.QuotaExceeded:
            assert time.monotonic() < deadline, "deleting never made room"
            time.sleep(0.5)
    client.set_quota("quoted")  # unlimited again, at once
    quoted.create_queue("q3")
    for i in range(5):
        first.send(f"unlimited {i}")


def test_a_byte_quota_refuses_a_send_that_would_pass_it(client):
    quoted = rayq.connect(account="bytes", key=client.create_account("bytes"))
    client.set_quota("bytes", bytes=10_000)
    queue = quoted.create_queue("big")
    queue.send_batch([rayq.Outgoing(b"x" * 4_000)] * 2)  # one put: nothing counted before
    with pytest.raises(rayq.QuotaExceeded):
        queue.send(b"x" * 4_000)
    with pytest.raises(rayq.InvalidMessage):
        client.set_quota("bytes", bytes=-1)
    with pytest.raises(rayq.InvalidMessage):
        client.set_quota("nobody-has-this-name", queues=1)
