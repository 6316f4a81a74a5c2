from typing import NamedTuple

from rayq.core.kit.tuples import quick_new
from rayq.core.storage import layout
from rayq.core.storage.dispatch import Released


class Point(NamedTuple):
    x: int
    y: int = 0


def test_a_quick_built_named_tuple_is_the_one_its_class_builds():
    built = quick_new(Point)((1, 2))
    assert built == Point(1, 2) and type(built) is Point and (built.x, built.y) == (1, 2)
    assert quick_new(Released)((b"row", True)) == Released(b"row", used=True)


def test_a_rows_header_reads_as_its_named_fields():
    value = layout.prefix(5, 9, layout.TASK, "acme".encode(), "report".encode()) + b"body"
    meta = layout.meta(value)
    assert type(meta) is layout.RowMeta
    assert (meta.enqueued_us, meta.expires_us, meta.dequeue_count, meta.flags) == (5, 9, 0, layout.TASK)
    assert (meta.tenant, meta.type, value[meta.body_at:]) == ("acme", "report", b"body")
