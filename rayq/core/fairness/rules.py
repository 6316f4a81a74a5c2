"""Suspension rules: a suspended fairness key is not dispatched (docs/fairness-coordinator.md).

A rule records who suspended the key, when and why; lifting it records who
lifted it and when. Rules are never deleted, so their history stays.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from rayq.core.kit.kv import KV
from rayq.core.codec.model import check_key, check_name, pack, unpack
from rayq.errors import InvalidMessage

_SEQ = struct.Struct(">Q")
MAX_REASON_CHARS = 1000


@dataclass(frozen=True)
class SuspensionRule:
    """One suspension of a key; ``lifted_at`` is None while it holds."""

    seq: int
    key: str
    reason: str
    by: str
    since: float
    lifted_at: float | None = None
    lifted_by: str | None = None

    @property
    def active(self) -> bool:
        return self.lifted_at is None


class SuspensionRules:
    """Every rule ever made, persisted in a KV's ``meta`` table."""

    def __init__(self, kv: KV):
        self.kv = kv
        self._rules: list[SuspensionRule] = kv.read(self._load)

    @staticmethod
    def _load(txn) -> list[SuspensionRule]:
        return [SuspensionRule(**unpack(v)) for _, v in txn.scan("meta", b"rule:", b"rule;")]

    def _save(self, rule: SuspensionRule) -> None:
        record = pack(vars(rule))
        self.kv.transact(lambda txn: txn.put("meta", b"rule:" + _SEQ.pack(rule.seq), record))

    def suspend(self, key: str, reason: str, by: str, now: float) -> SuspensionRule:
        """Suspend ``key`` (idempotent: an active rule is returned as it is)."""
        check_key(key)
        check_name(by, "by")
        if not isinstance(reason, str) or not reason or len(reason) > MAX_REASON_CHARS:
            raise InvalidMessage(f"reason must be a non-empty str of at most {MAX_REASON_CHARS} chars")
        for rule in self._rules:
            if rule.key == key and rule.active:
                return rule
        rule = SuspensionRule(len(self._rules) + 1, key, reason, by, now)
        self._save(rule)
        self._rules.append(rule)
        return rule

    def resume(self, key: str, by: str, now: float) -> SuspensionRule | None:
        """Lift the active rule of ``key``; returns it (None when there was none)."""
        check_key(key)
        for i, rule in enumerate(self._rules):
            if rule.key == key and rule.active:
                lifted = replace(rule, lifted_at=now, lifted_by=by)
                self._save(lifted)
                self._rules[i] = lifted
                return lifted
        return None

    def suspended(self) -> frozenset[str]:
        return frozenset(r.key for r in self._rules if r.active)

    def history(self) -> list[SuspensionRule]:
        return list(self._rules)
