"""Stateful property test: the memory store against a model small enough to trust.

The model keeps, per message id, its sequence number, fairness key, the time it
becomes visible and its one valid receipt. Receives must return exactly the
oldest visible messages (by visible time, then sequence), so no message is ever
handed to two receivers within its visibility timeout and none is lost.
"""

from collections import Counter
from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayq.core.storage.dispatch import DispatchPolicy
from rayq.core.codec.model import NewMessage, encode_body, to_us
from rayq.errors import ReceiptInvalid
from rayq.testing import FakeClock, memory_store
from rayq.core.storage.writes import ChangeVisibility, Delete, Put
from tests.contract.helpers import batch, received

KEYS = ["a", "b", "c"]
TIMEOUTS_S = [0, 1, 10, 30]


@dataclass
class Expected:
    seq: int
    key: str
    visible_at_us: int
    receipt: str | None = None
    dequeue_count: int = 0


class StoreVersusModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = FakeClock()
        # The model orders like FIFO dispatch; fair dispatch's order has its own tests
        # (tests/unit/test_dispatch.py), and every invariant here holds for both.
        self.store = memory_store(clock=self.clock, dispatch=DispatchPolicy(mode="fifo"))
        self.model: dict[str, Expected] = {}
        self.receipts: list[str] = []  # every receipt ever handed out, valid or stale
        self.puts = 0  # the model's sequence: the order messages were put in

    # -- helpers -------------------------------------------------------------
    def now_us(self) -> int:
        return to_us(self.clock.now())

    def visible(self, keys=None) -> list[str]:
        """Ids a receive should return, in order: by listen order when given, else oldest first."""
        now = self.now_us()
        ready = sorted((m.visible_at_us, m.seq, mid) for mid, m in self.model.items()
                       if m.visible_at_us <= now)
        if keys is None:
            return [mid for _, _, mid in ready]
        return [mid for key in dict.fromkeys(keys) for _, _, mid in ready
                if self.model[mid].key == key]

    def valid(self, receipt) -> str | None:
        return next((mid for mid, m in self.model.items() if m.receipt == receipt), None)

    def check_received(self, got, expected_ids, timeout_s) -> None:
        assert [m.id for m in got] == expected_ids
        for m in got:
            expected = self.model[m.id]
            expected.visible_at_us = self.now_us() + to_us(timeout_s)
            expected.receipt = m.receipt
            expected.dequeue_count += 1
            assert m.dequeue_count == expected.dequeue_count
            self.receipts.append(m.receipt)

    # -- operations ------------------------------------------------------------
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4),
          delay_s=st.sampled_from([0, 0, 0, 5]))
    def put(self, keys, delay_s):
        messages = [NewMessage(encode_body(i, 100), "t", "ty", key, delay_s)
                    for i, key in enumerate(keys)]
        ids = self.store.run(Put(0, batch(*messages)))
        assert len(set(ids) | set(self.model)) == len(ids) + len(self.model)
        for mid, key in zip(ids, keys):
            self.puts += 1
            self.model[mid] = Expected(self.puts, key, self.now_us() + to_us(delay_s))

    @rule(n=st.integers(1, 4), timeout_s=st.sampled_from(TIMEOUTS_S))
    def receive(self, n, timeout_s):
        expected = self.visible()[:n]
        self.check_received(received(self.store, 0, n, timeout_s), expected, timeout_s)

    @rule(n=st.integers(1, 4), timeout_s=st.sampled_from(TIMEOUTS_S),
          keys=st.lists(st.sampled_from(KEYS + ["nobody"]), max_size=3))
    def receive_in_listen_order(self, n, timeout_s, keys):
        expected = self.visible(keys)[:n]
        self.check_received(received(self.store, 0, n, timeout_s, keys=keys), expected, timeout_s)

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), forged=st.booleans())
    def delete(self, data, forged):
        receipt = "A" * 64 if forged else data.draw(st.sampled_from(self.receipts))
        mid = self.valid(receipt)
        assert self.store.run(Delete([receipt])) == ([] if mid else [receipt])
        if mid:
            del self.model[mid]

    @precondition(lambda self: self.receipts)
    @rule(data=st.data(), timeout_s=st.sampled_from(TIMEOUTS_S))
    def change_visibility(self, data, timeout_s):
        receipt = data.draw(st.sampled_from(self.receipts))
        mid = self.valid(receipt)
        if mid is None:
            try:
                self.store.run(ChangeVisibility(receipt, timeout_s))
            except ReceiptInvalid:
                return
            raise AssertionError("a stale receipt changed a message's visibility")
        newer = self.store.run(ChangeVisibility(receipt, timeout_s))
        self.model[mid].receipt = newer
        self.model[mid].visible_at_us = self.now_us() + to_us(timeout_s)
        self.receipts.append(newer)

    @rule(seconds=st.sampled_from([0.5, 1, 5, 10, 31]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule()
    def every_message_is_delivered_once_its_timeout_passes(self):
        self.clock.advance(max(TIMEOUTS_S) + 5)
        expected = self.visible()
        assert sorted(expected) == sorted(self.model)
        self.check_received(received(self.store, 0, 1000, 30), expected, 30)

    # -- invariants -----------------------------------------------------------------
    @invariant()
    def counts_match_the_model(self):
        assert self.store.count(0) == len(self.model)
        assert self.store.counts() == {(0, k): n for k, n in
                                       Counter(m.key for m in self.model.values()).items()}

    @invariant()
    def peek_shows_exactly_the_visible_messages(self):
        peeked = self.store.peek(0, 1000)
        assert [m.id for m in peeked] == self.visible()
        assert all(m.receipt is None for m in peeked)


TestStoreVersusModel = StoreVersusModel.TestCase
TestStoreVersusModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
