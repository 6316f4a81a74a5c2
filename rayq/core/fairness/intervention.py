"""Whether the coordinator's interventions act, for the whole runtime and per node
(docs/fairness-coordinator.md, "Passive intervention and intervention per node").

The source text: "the intervention may be passive merely logging problems with usage
when intervention is triggered in production", and "a central hub page may be
included to enable disable fair usage intervention on a per POD or node basis".

- mode ``"active"``: a decision to intervene reorders consumers' listen lists and
  starts booster consumers (rayq's rule since the start);
- mode ``"passive"`` (the text's per-POD switch, the POD being the whole runtime): every
  decision is still evaluated and recorded (``client.fairness()``, the event log),
  marked passive, but consumers keep the shards' fair dispatch and no booster starts;
- a node where intervention is off (the text's node, an application server of the
  dequeue cluster, is in rayq the Ray node a consumer runs on): consumers there ignore
  the plan's order, whatever the mode.

The settings start from :class:`~rayq.config.FairnessConfig` and an admin changes them
at run time (``client.set_intervention``); a change is persisted, so it outlives a
restart of the coordinator.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from rayq.config import INTERVENTION_MODES, FairnessConfig
from rayq.core.codec.model import check_name, pack, unpack
from rayq.core.kit.kv import KV
from rayq.errors import InvalidMessage

_KEY = b"intervention"
MAX_NODE_CHARS = 200


@dataclass(frozen=True)
class InterventionSettings:
    """The mode ("active" or "passive") and the nodes where intervention is off (a node
    is named by its Ray node id, its IP address or its ``rayq-data-node`` label); who
    changed them last and when (None: as configured)."""

    mode: str = "active"
    off_nodes: frozenset[str] = frozenset()
    changed_by: str | None = None
    changed_at: float | None = None

    @property
    def passive(self) -> bool:
        return self.mode == "passive"

    def acts_on(self, node_names: Collection[str]) -> bool:
        """Whether a consumer on the node known by ``node_names`` follows the plan."""
        return not self.passive and not (set(node_names) & self.off_nodes)


def check_node(node: object) -> str:
    if not isinstance(node, str) or not node or len(node) > MAX_NODE_CHARS:
        raise InvalidMessage(f"node must be a non-empty str of at most {MAX_NODE_CHARS} chars")
    return node


def configured(config: FairnessConfig) -> InterventionSettings:
    return InterventionSettings(config.intervention, frozenset(config.intervention_off_nodes))


def changed(settings: InterventionSettings, mode: str | None, node: str | None,
            enabled: bool | None, by: str, now: float) -> InterventionSettings:
    """``settings`` with ``mode`` set (the whole runtime), or with intervention on
    ``node`` switched ``enabled``. Raises InvalidMessage for anything else: no change
    named, both at once, an unknown mode, a node without ``enabled`` or the reverse."""
    check_name(by, "by")
    if mode is not None and (node is not None or enabled is not None):
        raise InvalidMessage("set either mode, or node and enabled, not both")
    if mode is not None:
        if mode not in INTERVENTION_MODES:
            raise InvalidMessage(f"mode must be one of {sorted(INTERVENTION_MODES)}, not {mode!r}")
        return replace(settings, mode=mode, changed_by=by, changed_at=now)
    if node is None or not isinstance(enabled, bool):
        raise InvalidMessage("name a mode, or a node with enabled=True or False")
    check_node(node)
    off = settings.off_nodes - {node} if enabled else settings.off_nodes | {node}
    return replace(settings, off_nodes=frozenset(off), changed_by=by, changed_at=now)


class InterventionSwitch:
    """The settings in force: the configured ones until an admin changes them, then the
    last change, persisted in a KV's ``meta`` table."""

    def __init__(self, kv: KV, config: FairnessConfig):
        self.kv = kv
        stored = kv.read(lambda txn: txn.get("meta", _KEY))
        self.settings = configured(config) if stored is None else _decoded(stored)

    def change(self, mode: str | None, node: str | None, enabled: bool | None, by: str,
               now: float) -> InterventionSettings:
        new = changed(self.settings, mode, node, enabled, by, now)
        record = pack({"mode": new.mode, "off_nodes": sorted(new.off_nodes),
                       "changed_by": new.changed_by, "changed_at": new.changed_at})
        self.kv.transact(lambda txn: txn.put("meta", _KEY, record))
        self.settings = new
        return new


def _decoded(stored: bytes) -> InterventionSettings:
    fields = unpack(stored)
    return InterventionSettings(fields["mode"], frozenset(fields["off_nodes"]),
                                fields["changed_by"], fields["changed_at"])
