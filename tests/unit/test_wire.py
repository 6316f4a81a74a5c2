"""Receive answers on the wire (rayq.core.codec.wire): several joined into one."""

import pytest

from rayq.core.codec.wire import decode_delivered, delivered_count, encode_delivered, join_delivered


def answer(subqueue: int, n: int) -> bytes:
    return encode_delivered([[f"{subqueue}-{i}", "r", b"\x01", "acme", "report", "k", 1, 5,
                              subqueue, 6] for i in range(n)])


@pytest.mark.parametrize("sizes", [(4, 4), (0, 3), (3, 0, 0), (15, 1), (10, 65_530), (7,)])
def test_joined_answers_hold_every_message_in_order(sizes):
    parts = [answer(sq, n) for sq, n in enumerate(sizes)]
    joined = join_delivered(parts)
    assert delivered_count(joined) == sum(sizes)
    assert [m.id for m in decode_delivered(joined)] == \
        [m.id for part in parts for m in decode_delivered(part)]
