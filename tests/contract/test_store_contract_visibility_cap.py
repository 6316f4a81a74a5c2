"""The visibility timeout's cap: SQS's 12 h by default, and the source text's 2 h when
StoreConfig.max_visibility_timeout_s says so (docs/visibility-and-receipts.md)."""

import pytest

from rayq.config import StoreConfig
from rayq.core.storage.writes import ChangeVisibility, Put
from rayq.errors import InvalidMessage
from tests.contract.helpers import batch, message, received

TWELVE_HOURS_S, TWO_HOURS_S = 43_200, 7_200


def test_twelve_hours_are_accepted_by_default_as_sqs_accepts_them(store):
    store.run(Put(0, batch(message(1))))
    [m] = received(store, 0, 1, TWELVE_HOURS_S)
    store.run(ChangeVisibility(m.receipt, TWELVE_HOURS_S))
    with pytest.raises(InvalidMessage):
        received(store, 0, 1, TWELVE_HOURS_S + 1)


def test_the_texts_two_hour_cap_is_one_setting_away_and_refuses_nothing_stored(make_store):
    store = make_store(StoreConfig(max_visibility_timeout_s=TWO_HOURS_S))
    store.run(Put(0, batch(message(1))))
    with pytest.raises(InvalidMessage):
        received(store, 0, 1, TWO_HOURS_S + 1)
    [m] = received(store, 0, 1, TWO_HOURS_S)  # the refused receive hid nothing
    with pytest.raises(InvalidMessage):
        store.run(ChangeVisibility(m.receipt, TWO_HOURS_S + 1))
    assert store.count(0) == 1
