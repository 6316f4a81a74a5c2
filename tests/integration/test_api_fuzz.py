"""Hypothesis drives the whole client API with good and bad arguments against a
real runtime: every valid call succeeds, every invalid one raises a UsageError, and
the set of stored messages stays exactly what the successful calls made it. Another
account's signed client tries the same queue throughout and is always refused.

Which arguments are valid is decided here from the documented limits (names,
seconds, counts, bodies), independently of the code under test."""

import math
import re

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import rayq
import rayq.queue

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                 st.binary(max_size=20), st.lists(st.integers(), max_size=3),
                 st.just(object()), st.integers(400, 600).map(lambda n: "x" * n), st.just(""))
BODIES = st.one_of(st.binary(max_size=64), st.text(max_size=64),
                   st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), st.just(object()),
                   st.just({(1, 2): "tuple key"}),
                   st.integers(1 << 16, 1 << 17).map(lambda n: b"x" * n))  # blobs
NAMES = st.one_of(st.sampled_from(["acme", "globex", "t-1"]), JUNK)
SECONDS = st.one_of(st.sampled_from([0, 0.5, 30]), JUNK)
CLIENT = None
INTRUDER = None  # a signed client of another account
CREATED: dict[str, object] = {}  # queue name -> max_receives, of every queue this module made
DAY_S = 86400.0


def valid_name(value) -> bool:
    """A tenant or type: a non-empty printable str of at most 128 chars."""
    return isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable()


def valid_queue_name(value) -> bool:
    return (isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,80}", value) is not None
            and not value.endswith("-dlq"))


def valid_seconds(value, high_s: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and not math.isnan(value) and 0 <= value <= high_s)


def valid_count(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def valid_body(value) -> bool:
    """bytes, str, or msgpack data whose map keys come back hashable (no tuple keys)."""
    if isinstance(value, (bytes, str)):
        return len(value) <= 16 << 20
    return isinstance(value, dict) and all(
        isinstance(k, str) and -(2**63) <= v < 2**64 for k, v in value.items())


def valid_outgoing(m) -> bool:
    return valid_body(m.body) and (m.tenant is None or valid_name(m.tenant)) and valid_name(m.type)


def attempt(call, valid: bool):
    """Run one API call: (True, value) on success, (False, None) when refused. A valid
    call must succeed; an invalid one must be refused as a UsageError (a RuntimeFailure
    here would mean it broke)."""
    try:
        value = call()
    except rayq.UsageError as err:
        assert not valid, f"a valid call was refused: {err!r}"
        return False, None
    assert valid, f"an invalid call was accepted and returned {value!r}"
    return True, value


class ClientAPI(RuleBasedStateMachine):
    @initialize()
    def fresh_queue(self):
        self.n = getattr(ClientAPI, "_n", 0) + 1
        ClientAPI._n = self.n
        self.q = CLIENT.create_queue(f"fuzz{self.n}", max_receives=None)
        CREATED[self.q.name] = None
        self.stored: set[str] = set()
        self.receipts: dict[str, str] = {}   # receipt -> message id, still valid

    @rule(body=BODIES, tenant=NAMES, type_=NAMES, delay_s=st.one_of(st.just(0), SECONDS))
    def send(self, body, tenant, type_, delay_s):
        valid = (valid_body(body) and (tenant is None or valid_name(tenant)) and valid_name(type_)
                 and valid_seconds(delay_s, 7 * DAY_S))
        ok, mid = attempt(lambda: self.q.send(body, tenant=tenant, type=type_, delay_s=delay_s),
                          valid)
        if ok:
            self.stored.add(mid)

    @rule(items=st.one_of(JUNK, st.lists(st.one_of(st.builds(rayq.Outgoing, BODIES, NAMES, NAMES),
                                                   JUNK), max_size=4)))
    def send_batch(self, items):
        valid = (isinstance(items, list) and 1 <= len(items) <= 1000
                 and all(isinstance(m, rayq.Outgoing) and valid_outgoing(m) for m in items))
        ok, mids = attempt(lambda: self.q.send_batch(items), valid)
        if ok:
            self.stored.update(mids)

    @rule(n=st.one_of(st.integers(1, 5), JUNK), timeout=st.one_of(st.just(60), SECONDS))
    def receive(self, n, timeout):
        valid = valid_count(n, 1, 1000) and valid_seconds(timeout, 12 * 3600)
        ok, got = attempt(lambda: self.q.receive(max_messages=n, visibility_timeout_s=timeout),
                          valid)
        if ok:
            for m in got:
                assert m.id in self.stored
                self.receipts = {r: i for r, i in self.receipts.items() if i != m.id}
                self.receipts[m.receipt] = m.id

    @rule(data=st.data())
    def delete(self, data):
        receipt = data.draw(st.one_of(st.sampled_from(sorted(self.receipts)) if self.receipts
                                      else JUNK, JUNK))
        valid = isinstance(receipt, str) and receipt in self.receipts
        ok, _ = attempt(lambda: self.q.delete(receipt), valid)
        if ok:
            self.stored.discard(self.receipts.pop(receipt))

    @rule(receipts=st.one_of(JUNK, st.lists(JUNK, max_size=3)))
    def delete_batch_of_junk(self, receipts):
        if isinstance(receipts, list) and receipts:  # junk receipts: all of them come back
            with pytest.raises(rayq.ReceiptInvalid) as refused:
                self.q.delete_batch(receipts)
            assert list(refused.value.receipts) == receipts
        else:  # an empty list deletes nothing and succeeds; anything else is refused
            attempt(lambda: self.q.delete_batch(receipts), receipts == [])

    @rule(data=st.data(), timeout=SECONDS)
    def change_visibility(self, data, timeout):
        receipt = data.draw(st.sampled_from(sorted(self.receipts)) if self.receipts else JUNK)
        valid = (isinstance(receipt, str) and receipt in self.receipts
                 and valid_seconds(timeout, 12 * 3600))
        ok, new = attempt(lambda: self.q.change_visibility(receipt, timeout), valid)
        if ok:
            self.receipts[new] = self.receipts.pop(receipt)

    @rule(n=st.one_of(st.integers(1, 5), JUNK))
    def peek(self, n):
        ok, got = attempt(lambda: self.q.peek(n), valid_count(n, 1, 1000))
        if ok:
            assert {m.id for m in got} <= self.stored

    @rule(name=st.one_of(JUNK, st.just("fuzz-dlq"), st.just("ok-name")),
          subqueues=st.one_of(st.integers(1, 2), JUNK), max_receives=st.one_of(st.none(), JUNK))
    def admin(self, name, subqueues, max_receives):
        valid = (valid_queue_name(name) and valid_count(subqueues, 1, 64)
                 and (max_receives is None or valid_count(max_receives, 1, 1000))
                 and CREATED.get(name, max_receives) == max_receives)  # else QueueExists
        ok, _ = attempt(lambda: CLIENT.create_queue(name, subqueues=subqueues,
                                                    max_receives=max_receives), valid)
        if ok:
            CREATED[name] = max_receives
        attempt(lambda: CLIENT.queue(name), isinstance(name, str) and name in CREATED)

    @rule(n=JUNK)
    def scale_consumers_with_junk(self, n):
        # valid counts, and None (the configured count), would start real consumers: skipped
        if n is not None and not valid_count(n, 0, 1000):
            attempt(lambda: CLIENT.scale_consumers(n), valid=False)

    @rule(data=st.data(), what=st.sampled_from(
        ["send", "receive", "peek", "count", "clear", "delete", "change_visibility", "drop"]))
    def another_account_tries(self, data, what):
        """A genuine signed client of another account goes for this queue, naming it as the
        default account's: QueueNotFound (it is not visible) or AuthError."""
        receipt = data.draw(st.sampled_from(sorted(self.receipts)) if self.receipts else JUNK)
        theirs = rayq.queue.Queue(INTRUDER.transport, "default/" + self.q.name)
        calls = {"send": lambda: theirs.send("x"), "receive": lambda: theirs.receive(5),
                 "peek": lambda: theirs.peek(5), "count": theirs.count, "clear": theirs.clear,
                 "delete": lambda: theirs.delete(receipt),
                 "change_visibility": lambda: theirs.change_visibility(receipt, 0),
                 "drop": lambda: INTRUDER.delete_queue(self.q.name)}
        refused = (rayq.AuthError, rayq.QueueNotFound)
        if what in ("delete", "change_visibility") and not (
                isinstance(receipt, str) and receipt in self.receipts):
            refused = (*refused, rayq.ReceiptInvalid)  # junk is junk to anyone
        with pytest.raises(refused):
            calls[what]()

    @invariant()
    def stored_messages_are_exactly_the_model(self):
        if hasattr(self, "q"):
            assert self.q.count() == len(self.stored)


@pytest.mark.parametrize("seed", [0])
def test_every_call_succeeds_or_raises_a_rayq_error_and_storage_stays_exact(client, seed):
    global CLIENT, INTRUDER
    CLIENT = client
    CREATED.clear()
    if INTRUDER is None:
        INTRUDER = rayq.connect(account="fuzz-intruder", key=client.create_account("fuzz-intruder"))
    machine = ClientAPI.TestCase
    machine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None,
                                suppress_health_check=list(HealthCheck), derandomize=True)
    machine().runTest()
