"""Values kept for a time to live and renewed ahead of it: a read in the background
past half the time to live, so a value in use is never waited for.

Pure bookkeeping (the caller reads and says when): :meth:`Renewed.get` answers the value
and whether to start a renewal; :meth:`Renewed.keep` takes a read's value unless a later
read, or a change (:meth:`Renewed.changed`), came after the read began.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

MISSING = object()  # get(): nothing kept, or kept too long ago: read it now


class Renewed:
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._kept: dict[Hashable, tuple[float, Any]] = {}   # name -> (read at, value)
        self._changed_at: dict[Hashable, float] = {}
        self._renewing: set[Hashable] = set()

    def get(self, name: Hashable, now: float) -> tuple[Any, bool]:
        """(the value, or MISSING; whether to renew it in the background now). A renewal
        asked for is under way until :meth:`renewed`."""
        kept = self._kept.get(name)
        if kept is None or now - kept[0] >= self.ttl_s:
            return MISSING, False
        renew = now - kept[0] > self.ttl_s / 2 and name not in self._renewing
        if renew:
            self._renewing.add(name)
        return kept[1], renew

    def keep(self, name: Hashable, read_at: float, value: Any) -> Any:
        """Keep ``value``, read from ``read_at`` on, unless something newer is known;
        returns it."""
        kept = self._kept.get(name)
        if (kept is None or kept[0] <= read_at) and self._changed_at.get(name, -1.0) <= read_at:
            self._kept[name] = (read_at, value)
        return value

    def renewed(self, name: Hashable) -> None:
        """The background renewal of ``name`` ended (kept or failed)."""
        self._renewing.discard(name)

    def changed(self, name: Hashable, now: float) -> None:
        """``name`` changed at ``now``: reads begun before are stale."""
        self._kept.pop(name, None)
        self._changed_at[name] = now
