"""Cluster-wide concurrency limits for job types, as expiring leases.

A consumer about to run a message of a concurrency-limited type asks for a
lease; it gets one while fewer than ``limit`` live leases exist for that type.
Leases expire on their own (a consumer killed mid-handler cannot leak its
slot) and are renewed by the same heartbeats that extend the message's
visibility, so a lease lives exactly as long as the work it covers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseStats:
    """Per type: live leases, granted and refused requests since start."""

    held: dict[str, int]
    granted: dict[str, int]
    refused: dict[str, int]


class ConcurrencyLeases:
    """Leases per job type; ``now`` is passed in by the caller (seconds)."""

    def __init__(self):
        self._leases: dict[str, dict[str, float]] = {}   # type -> lease id -> expires at
        self._granted: dict[str, int] = {}
        self._refused: dict[str, int] = {}

    def acquire(self, type_: str, lease_id: str, limit: int, ttl_s: float, now: float) -> bool:
        """Grant ``lease_id`` a slot of ``type_`` until ``now + ttl_s`` unless ``limit`` are held.
        Acquiring a lease already held renews it."""
        held = self._live(type_, now)
        if lease_id not in held and len(held) >= limit:
            self._refused[type_] = self._refused.get(type_, 0) + 1
            return False
        held[lease_id] = now + ttl_s
        self._granted[type_] = self._granted.get(type_, 0) + 1
        return True

    def renew(self, type_: str, lease_id: str, ttl_s: float, now: float) -> bool:
        """Extend a live lease; False when it has expired (its slot may be someone else's)."""
        held = self._live(type_, now)
        if lease_id not in held:
            return False
        held[lease_id] = now + ttl_s
        return True

    def release(self, type_: str, lease_id: str) -> None:
        self._leases.get(type_, {}).pop(lease_id, None)

    def held(self, type_: str, now: float) -> int:
        return len(self._live(type_, now))

    def stats(self, now: float) -> LeaseStats:
        return LeaseStats({t: len(self._live(t, now)) for t in list(self._leases)},
                          dict(self._granted), dict(self._refused))

    def _live(self, type_: str, now: float) -> dict[str, float]:
        held = self._leases.setdefault(type_, {})
        for lease_id in [k for k, expires in held.items() if expires <= now]:
            del held[lease_id]
        return held
