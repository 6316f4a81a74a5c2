"""The codec, receipts, rows and argument checks of rayq.core.codec.model."""

import math
from dataclasses import replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayq.core.storage import layout
from rayq.core.codec.model import (ROW_KEY, US, Ending, Receipt, Received, StoredMessage, check_count,
                             check_name, check_seconds, decode_body, encode_body, fairness_key,
                             to_us)
from rayq.errors import InvalidMessage, MessageTooLarge, ReceiptInvalid

# -- bodies ------------------------------------------------------------------------------


def value_id(value) -> str:
    """A test id that is the same in every collection: the value's repr, or its type
    where the repr holds an address."""
    text = repr(value)
    return type(value).__name__ if " at 0x" in text else text


@pytest.mark.parametrize("value, back", [
    (b"raw", b"raw"), (bytearray(b"ba"), b"ba"), (memoryview(b"mv"), b"mv"), (b"", b""),
    ("text ✓", "text ✓"), ("\udc80", "\udc80"), ("", ""),
    (None, None), (False, False), (-(2**63), -(2**63)), (2**64 - 1, 2**64 - 1),
    (0.1, 0.1), ([1, [2, b"3"]], [1, [2, b"3"]]), ({"a": {"b": None}}, {"a": {"b": None}}),
    ((1, 2), [1, 2]),  # msgpack has one array type: tuples come back as lists
], ids=value_id)
def test_a_body_decodes_to_the_value_it_was_encoded_from(value, back):
    decoded = decode_body(encode_body(value, 1 << 20))
    assert decoded == back and type(decoded) is type(back)


@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text()
                    | st.binary() | st.floats(allow_nan=False),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                    max_leaves=20))
@settings(max_examples=200)
def test_any_msgpack_value_round_trips(value):
    assert decode_body(encode_body(value, 1 << 20)) == value


@pytest.mark.parametrize("value, max_bytes, fits", [
    (b"x" * 10, 10, True), (b"x" * 11, 10, False),
    ("é" * 5, 10, True), ("é" * 6, 10, False),  # str limits count utf-8 bytes
    ([1] * 9, 10, True), ([1] * 10, 10, False),  # 1 header byte + one byte per small int
])
def test_a_body_over_max_bytes_is_refused(value, max_bytes, fits):
    if fits:
        assert len(encode_body(value, max_bytes)) <= max_bytes + 1
    else:
        with pytest.raises(MessageTooLarge):
            encode_body(value, max_bytes)


@pytest.mark.parametrize("value", [object(), {1, 2}, 2**64, -(2**63) - 1], ids=value_id)
def test_a_value_msgpack_cannot_pack_is_an_invalid_message(value):
    with pytest.raises(InvalidMessage):
        encode_body(value, 1 << 20)


@pytest.mark.parametrize("value, back", [
    ({1: "a"}, {1: "a"}), ({None: 1}, {None: 1}), ({-1: {2.5: b"x"}}, {-1: {2.5: b"x"}}),
    ({(1, 2): 3}, InvalidMessage),  # the key comes back as a list, which no dict can hold
], ids=repr)
def test_a_map_with_non_str_keys_round_trips_or_is_refused_at_send(value, back):
    if back is InvalidMessage:
        with pytest.raises(InvalidMessage):
            encode_body(value, 1 << 20)
    else:
        assert decode_body(encode_body(value, 1 << 20)) == back


@pytest.mark.parametrize("data", [
    b"",                                  # no tag at all
    b"\x03payload", b"\xffpayload",       # unknown tags
    b"\x02",                              # packed tag, nothing packed
    b"\x02\xc1",                          # a byte msgpack never uses
    b"\x02\x92\x01",                      # truncated array
    b"\x02\x01\x02",                      # extra data after the value
    b"\x02\xd4\x01\x00",                  # ext types are refused
    b"\x02\x81\x92\x01\x02\x01",          # an array as map key (unhashable)
    b"\x02\xa2\xff\xfe",                  # str that is not utf-8
    b"\x02\xdd\xff\xff\xff\xff",          # array header over max_array_len
    b"\x02\xdf\xff\xff\xff\xff",          # map header over max_map_len
    b"\x02\xdb\xff\xff\xff\xff",          # str header longer than the data
    b"\x02" + b"\x91" * 100_000 + b"\x01",  # nesting deeper than the unpacker's stack
], ids=repr)
def test_malformed_bodies_are_invalid_messages(data):
    with pytest.raises(InvalidMessage):
        decode_body(data)


def test_a_str_body_that_is_not_utf8_is_an_invalid_message():
    with pytest.raises(InvalidMessage):
        decode_body(b"\x01\xff")


@given(st.binary(max_size=64))
@settings(max_examples=300)
def test_arbitrary_packed_bytes_decode_as_msgpack_does_or_raise_invalid_message(payload):
    try:
        decoded = decode_body(b"\x02" + payload)
    except InvalidMessage:
        return
    reference = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    # compare packed forms so NaN (never equal to itself) compares equal
    assert msgpack.packb(decoded, use_bin_type=True) == msgpack.packb(reference, use_bin_type=True)


# -- receipts ----------------------------------------------------------------------------
ROW_KEY_7 = ROW_KEY.pack(7, 3, 1_700_000_000 * US, 42)


def test_a_receipt_encodes_to_text_and_back():
    receipt = Receipt(ROW_KEY_7, b"12345678")
    text = receipt.encode()
    assert isinstance(text, str) and len(text) == 64 and text.isascii()
    assert Receipt.decode(text) == receipt and Receipt.decode(text).subqueue == 7


@pytest.mark.parametrize("text", [
    None, 42, b"bytes" * 13, "", "short", "A" * 63, "A" * 65, "é" * 64, "!" * 64, " " * 64,
    "g" * 64, Receipt(ROW_KEY_7, b"12345678").encode()[:-2] + "==",
], ids=repr)
def test_text_that_is_not_a_receipt_is_refused(text):
    with pytest.raises(ReceiptInvalid):
        Receipt.decode(text)


# -- rows --------------------------------------------------------------------------------
def test_a_row_keeps_its_header_names_and_body_and_a_redelivery_changes_only_three_fields():
    value = layout.prefix(1, 2, layout.TASK, "acmé".encode(), b"report") + b"\x00body"
    meta = layout.meta(value)
    assert (meta.enqueued_us, meta.expires_us, meta.dequeue_count, meta.task, meta.nonce,
            meta.first_received_us, meta.tenant, meta.type, value[meta.body_at:]) == (
        1, 2, 0, True, layout.NO_NONCE, 0, "acmé", "report", b"\x00body")
    again = layout.redelivered(value, 3, b"nonce123", 7)
    assert layout.meta(again) == meta._replace(dequeue_count=3, nonce=b"nonce123",
                                             first_received_us=7)
    assert layout.nonce_of(again) == b"nonce123" and again[meta.body_at:] == b"\x00body"


def test_the_first_receive_sets_the_first_receive_time_and_later_receives_keep_it():
    value = layout.prefix(1, 2, 0, b"acme", b"report") + b"body"
    times = []
    for now_us in (10, 20, 30):  # three receives, as the shard makes them
        meta = layout.meta(value)
        value = layout.redelivered(value, meta.dequeue_count + 1, b"nonce123",
                                 layout.first_received(meta, now_us))
        times.append(layout.meta(value).first_received_us)
    assert times == [10, 10, 10] and layout.meta(value).dequeue_count == 3


def test_received_decodes_the_body_of_a_stored_message():
    stored = StoredMessage("id", "r", encode_body({"n": 1}, 100), "acme", "report", "k", 2,
                           1.5, 0)
    assert Received.from_stored(stored) == Received("id", "r", {"n": 1}, "acme", "report", 2, 1.5)
    first = Received.from_stored(replace(stored, first_received_at_s=2.5))
    assert first.first_received_at_s == 2.5


# -- checks -----------------------------------------------------------------------------
@pytest.mark.parametrize("value, ok", [
    ("acme", True), ("é-テナント", True), ("x" * 128, True), ("with space", True),
    ("", False), ("x" * 129, False), ("tab\there", False), ("nul\x00", False),
    (None, False), (5, False), (b"acme", False),
])
def test_names_are_non_empty_printable_strings_up_to_128_chars(value, ok):
    if ok:
        assert check_name(value, "tenant") == value
    else:
        with pytest.raises(InvalidMessage):
            check_name(value, "tenant")


@pytest.mark.parametrize("value, ok", [
    (0, True), (1.5, True), (10, True),
    (-0.001, False), (10.001, False), (math.inf, False), (math.nan, False),
    (True, False), ("5", False), (None, False),
])
def test_seconds_are_real_numbers_within_bounds(value, ok):
    if ok:
        assert check_seconds(value, "timeout_s", 0, 10) == float(value)
    else:
        with pytest.raises(InvalidMessage):
            check_seconds(value, "timeout_s", 0, 10)


@pytest.mark.parametrize("value, ok", [
    (1, True), (1000, True), (0, False), (1001, False), (1.0, False), (True, False), ("1", False),
])
def test_counts_are_ints_within_bounds(value, ok):
    if ok:
        assert check_count(value, "max_messages", 1, 1000) == value
    else:
        with pytest.raises(InvalidMessage):
            check_count(value, "max_messages", 1, 1000)


@pytest.mark.parametrize("mode, key", [
    ("type", "report"), ("tenant", "acme"), ("tenant_type", "acme/report"),
])
def test_the_fairness_key_follows_the_mode(mode, key):
    assert fairness_key("acme", "report", mode) == key


@pytest.mark.parametrize("seconds, us", [(0, 0), (1.5, 1_500_000), (1e-6, 1), (4e-7, 0),
                                         (1_700_000_000.000001, 1_700_000_000_000_001)])
def test_seconds_convert_to_whole_microseconds(seconds, us):
    assert to_us(seconds) == us


def test_the_unpacker_limits_are_accepted_by_msgpack():
    # Regression: an unknown keyword made every packed body fail to decode.
    assert decode_body(encode_body({"a": [1]}, 100)) == {"a": [1]}
    assert msgpack.version >= (1, 0, 0)


# -- the other tables' bytes (rayq.core.storage.layout) ------------------------------------
def test_a_tenant_count_key_reads_back_as_the_count_it_names_and_sorts_by_kind_first():
    from rayq.core.codec.model import CountKind, TenantCount

    live = TenantCount(CountKind.LIVE, 7, "report", "acmé")
    spilled = live._replace(kind=CountKind.SPILLED)
    assert layout.parse_tenant_count_key(layout.tenant_count_key(live)) == live
    assert layout.parse_tenant_count_key(layout.tenant_count_key(spilled)).kind is CountKind.SPILLED
    assert layout.tenant_count_key(live) < layout.tenant_count_key(spilled)
    assert live == ("L", 7, "report", "acmé")  # policy reads counts as plain data


def test_a_spill_entry_keeps_its_source_key_visibility_and_row():
    stored = layout.spill_value(3, 9, 123_456, b"row value")
    assert layout.parse_spilled(stored) == layout.Spilled(3, 9, 123_456, b"row value")
    assert layout.spill_source(stored) == 3
    start, stop = layout.spill_range(5)
    assert start <= layout.spill_key(5, 0) < layout.spill_key(5, 2 ** 63) < stop
    assert layout.spill_seq(layout.spill_key(5, 42)) == 42


def test_an_outcome_reads_back_and_matches_only_its_own_expiry_entry():
    value = layout.outcome_value(1_000, Ending.RESULT, b"payload")
    assert layout.parse_outcome(value) == (Ending.RESULT, b"payload")
    assert layout.outcome_expires_with(value, layout.outcome_expiry_key(1_000, "m-1"))
    assert not layout.outcome_expires_with(value, layout.outcome_expiry_key(999, "m-1"))
    assert layout.outcome_of_expiry(layout.outcome_expiry_key(1_000, "m-1")) == layout.outcome_key("m-1")
    assert layout.outcome_expiry_key(1_000, "z") < layout.outcome_expiry_stop(1_000) \
        <= layout.outcome_expiry_key(1_001, "a")


def test_meta_records_of_a_kind_fall_in_its_range_and_give_back_their_number():
    start, stop = layout.meta_range(layout.STATE)
    for sq in (0, 1, 2 ** 32):
        key = layout.meta_key(layout.STATE, sq)
        assert start <= key < stop and layout.meta_tail_int(layout.STATE, key) == sq
    assert not start <= layout.meta_key(layout.PURGE, 1) < stop


def test_row_keys_of_a_pair_fall_in_its_range_and_hidden_rows_after_visible_ones():
    start, stop = layout.key_range(2, 5)
    visible, hidden = layout.row_key(2, 5, 100, 9), layout.row_key(2, 5, 201, 1)
    assert start <= visible < layout.hidden_from(2, 5, 200) <= hidden < stop
    assert layout.parse_row_key(hidden) == (2, 5, 201, 1) and layout.pair_of(hidden) == (2, 5)
    assert layout.subqueue_range(2)[0] <= start and stop <= layout.subqueue_range(2)[1]


@pytest.mark.parametrize("asked, parks", [(None, 0.0), (0, 0.0), (1.5, 1.5), (20, 20.0),
                                          (21, 20.0), (1e9, 20.0), (float("inf"), 20.0)])
def test_a_receive_parks_at_most_twenty_seconds_whatever_it_asks(asked, parks):
    from rayq.core.codec.model import long_poll_s
    assert long_poll_s(asked) == parks


@pytest.mark.parametrize("asked", [-1, float("nan"), "20", True])
def test_a_wait_that_is_no_duration_is_refused(asked):
    from rayq.core.codec.model import long_poll_s
    from rayq.errors import InvalidMessage
    with pytest.raises(InvalidMessage):
        long_poll_s(asked)


def test_message_ids_carry_a_keyed_tag_so_one_id_does_not_tell_the_next():
    from rayq.core.codec.model import message_id
    key, other = b"k" * 16, b"o" * 16
    first, second = message_id("ab12", key, 1), message_id("ab12", key, 2)
    assert first.startswith("ab12-1-") and second.startswith("ab12-2-")
    assert first.rsplit("-", 1)[1] != second.rsplit("-", 1)[1]
    assert message_id("ab12", key, 2) == second  # the same message keeps its id
    assert message_id("ab12", other, 2) != second  # without the store's key, no id
    assert len(second.rsplit("-", 1)[1]) == 16  # 64 bits to guess
