"""Suspension rules keep their history when lifted, and survive reopening."""

import pytest

from rayq.core.kit.kv import LmdbKV
from rayq.core.fairness.rules import SuspensionRules
from rayq.errors import InvalidMessage


def test_a_lifted_rule_keeps_who_when_and_why(tmp_path):
    rules = SuspensionRules(LmdbKV(tmp_path / "c"))
    first = rules.suspend("report", reason="db overloaded", by="ops", now=10.0)
    assert rules.suspend("report", reason="again", by="ops", now=11.0) == first  # idempotent
    assert rules.suspended() == {"report"}
    lifted = rules.resume("report", by="ana", now=20.0)
    assert (lifted.reason, lifted.by, lifted.since, lifted.lifted_at, lifted.lifted_by) == \
        ("db overloaded", "ops", 10.0, 20.0, "ana")
    assert rules.suspended() == frozenset() and rules.resume("report", by="x", now=21.0) is None
    rules.suspend("report", reason="second time", by="ops", now=30.0)
    rules.kv.close()
    again = SuspensionRules(LmdbKV(tmp_path / "c"))
    assert [(r.reason, r.active) for r in again.history()] == [("db overloaded", False),
                                                               ("second time", True)]


@pytest.mark.parametrize("key, reason, by", [("", "r", "ops"), ("k", "", "ops"), ("k", "r", ""),
                                             (3, "r", "ops"), ("k", "x" * 1001, "ops")])
def test_bad_rules_are_refused(tmp_path, key, reason, by):
    rules = SuspensionRules(LmdbKV(tmp_path / "c"))
    with pytest.raises(InvalidMessage):
        rules.suspend(key, reason=reason, by=by, now=1.0)
    assert rules.history() == []
