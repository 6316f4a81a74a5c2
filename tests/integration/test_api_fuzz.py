"""Hypothesis drives the whole client API with good and bad arguments against a
real runtime: every call either succeeds or raises a RayqError subclass, and the
set of stored messages stays exactly what the successful calls made it. Another
account's signed client tries the same queue throughout and is always refused."""

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


def attempt(call):
    """Run one API call: (True, value) on success, (False, None) for bad input, which
    must be refused as a UsageError (a RuntimeFailure here would mean it broke)."""
    try:
        return True, call()
    except rayq.UsageError:
        return False, None


class ClientAPI(RuleBasedStateMachine):
    @initialize()
    def fresh_queue(self):
        self.n = getattr(ClientAPI, "_n", 0) + 1
        ClientAPI._n = self.n
        self.q = CLIENT.create_queue(f"fuzz{self.n}", max_receives=None)
        self.stored: set[str] = set()
        self.receipts: dict[str, str] = {}   # receipt -> message id, still valid

    @rule(body=BODIES, tenant=NAMES, type_=NAMES, delay_s=st.one_of(st.just(0), SECONDS))
    def send(self, body, tenant, type_, delay_s):
        ok, mid = attempt(lambda: self.q.send(body, tenant=tenant, type=type_, delay_s=delay_s))
        if ok:
            self.stored.add(mid)

    @rule(items=st.one_of(JUNK, st.lists(st.one_of(st.builds(rayq.Outgoing, BODIES, NAMES, NAMES),
                                                   JUNK), max_size=4)))
    def send_batch(self, items):
        ok, mids = attempt(lambda: self.q.send_batch(items))
        if ok:
            self.stored.update(mids)

    @rule(n=st.one_of(st.integers(1, 5), JUNK), timeout=st.one_of(st.just(60), SECONDS))
    def receive(self, n, timeout):
        ok, got = attempt(lambda: self.q.receive(max_messages=n, visibility_timeout_s=timeout))
        if ok:
            for m in got:
                assert m.id in self.stored
                self.receipts = {r: i for r, i in self.receipts.items() if i != m.id}
                self.receipts[m.receipt] = m.id

    @rule(data=st.data())
    def delete(self, data):
        receipt = data.draw(st.one_of(st.sampled_from(sorted(self.receipts)) if self.receipts
                                      else JUNK, JUNK))
        ok, _ = attempt(lambda: self.q.delete(receipt))
        if ok:
            self.stored.discard(self.receipts.pop(receipt))
        else:
            assert not (isinstance(receipt, str) and receipt in self.receipts)

    @rule(receipts=st.one_of(JUNK, st.lists(JUNK, max_size=3)))
    def delete_batch_of_junk(self, receipts):
        attempt(lambda: self.q.delete_batch(receipts))

    @rule(data=st.data(), timeout=SECONDS)
    def change_visibility(self, data, timeout):
        receipt = data.draw(st.sampled_from(sorted(self.receipts)) if self.receipts else JUNK)
        ok, new = attempt(lambda: self.q.change_visibility(receipt, timeout))
        if ok:
            self.receipts[new] = self.receipts.pop(receipt)

    @rule(n=st.one_of(st.integers(1, 5), JUNK))
    def peek(self, n):
        ok, got = attempt(lambda: self.q.peek(n))
        if ok:
            assert {m.id for m in got} <= self.stored

    @rule(name=st.one_of(JUNK, st.just("fuzz-dlq"), st.just("ok-name")),
          subqueues=st.one_of(st.integers(1, 2), JUNK), max_receives=st.one_of(st.none(), JUNK))
    def admin(self, name, subqueues, max_receives):
        attempt(lambda: CLIENT.create_queue(name, subqueues=subqueues, max_receives=max_receives))
        attempt(lambda: CLIENT.queue(name))

    @rule(n=JUNK)
    def scale_consumers_with_junk(self, n):
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1000):
            ok, _ = attempt(lambda: CLIENT.scale_consumers(n))  # only invalid counts here
            assert not ok

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
    if INTRUDER is None:
        INTRUDER = rayq.connect(account="fuzz-intruder", key=client.create_account("fuzz-intruder"))
    machine = ClientAPI.TestCase
    machine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None,
                                suppress_health_check=list(HealthCheck), derandomize=True)
    machine().runTest()
