"""Where actors other than the manager fetch the directory their gates
(:mod:`rayq.core.auth.gate`) verify signed requests with."""

from __future__ import annotations

import ray

from actors import MANAGER, NAMESPACE
from rayq.core.auth.gate import Directory
from rayq.remote import call_async


async def manager_directory() -> Directory:
    """The directory as the manager holds it (how actors other than the manager fetch)."""
    manager = ray.get_actor(MANAGER, namespace=NAMESPACE)
    return await call_async(lambda: manager.directory.remote())
