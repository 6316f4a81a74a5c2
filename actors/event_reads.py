"""Reading each node's event files on that node (docs/event-log-analytics.md).

Every data node keeps its writers' events in its own folder, ``<data_dir>/<node>/events``
(its shards', and the coordinator's and flood detector's where they lead). A report
lists and reads each node's new files with a Ray task pinned to that node (hard node
affinity: no process opens another node's files); the tables come back through Ray's
object store, where Spark takes them (rayq.analytics.warm). With
``AnalyticsConfig.events_uri`` every writer shares one place, read by the asking process.

A node drained (``client.drain``) ships its event files to the node whose manager
asked, keeping their names, before the drain is reported done: removing the node
afterwards loses none of its events, and a file seen in both places is read once
(:func:`rayq.analytics.sources.plan_reads`).
"""

from __future__ import annotations

import asyncio
import os

import ray

from actors.data_nodes import data_nodes, pinned
from rayq.analytics.sources import (NewEvents, aggregate_event_files, list_event_files,
                                    local_events, plan_reads, read_file_bytes, timeline_blocks,
                                    write_shipped)
from rayq.config import Config
from rayq.core.control.placement import node_folder
from rayq.errors import RuntimeFailure

READ_TIMEOUT_S = 600.0
SHIP_FILES_PER_CALL = 64  # event files per shipping call (a few MB each at most)


def events_dir(data_dir: str, node: str) -> str:
    """Node ``node``'s events folder (``data_dir/events`` for the embedded runtime's)."""
    return os.path.join(node_folder(data_dir, node), "events")


@ray.remote(num_cpus=0)
def _listed(root: str) -> list[str]:
    return list_event_files(root)


@ray.remote(num_cpus=0, num_returns=3)
def _read(source: str, root: str, names: list[str], window_s: float):
    """(EventRead, cells, timeline rows) of files ``names`` under ``root``, read and
    aggregated on this node."""
    done = aggregate_event_files(root, names, window_s, source,
                                 ray.get_runtime_context().get_node_id())
    return done.read, done.cells, done.timeline


@ray.remote(num_cpus=0)
def _file_bytes(root: str, names: list[str]) -> list[tuple[str, bytes]]:
    return read_file_bytes(root, names)


def gather_events(config: Config, data_dir: str, known: frozenset[str],
                  window_s: float) -> NewEvents:
    """The events of the files not in ``known``, aggregated for windows of ``window_s``:
    each data node's read on that node, or the events URI's read here. Returns once
    the files are listed, with the reads under way (``NewEvents.ready`` waits for them).
    Raises RuntimeFailure when a node does not answer."""
    uri = config.analytics.events_uri
    if uri:
        return local_events(uri, known, window_s, ray.get_runtime_context().get_node_id())
    try:
        return _gather_from_nodes(config, data_dir, known, window_s)
    except ray.exceptions.RayError as err:
        raise _failed(err) from err


def _gather_from_nodes(config: Config, data_dir: str, known: frozenset[str],
                       window_s: float) -> NewEvents:
    nodes = {n.name: n for n in data_nodes(config)}
    listed = {name: _listed.options(**pinned(n)).remote(events_dir(data_dir, name))
              for name, n in nodes.items()}
    listings = {}
    for name, ref in listed.items():
        try:
            listings[name] = ray.get(ref, timeout=READ_TIMEOUT_S)
        except ray.exceptions.TaskUnschedulableError:
            pass  # the node left after Ray listed it alive: its files left with it
    plan = plan_reads(listings, known)
    reads = [_read.options(**pinned(nodes[name])).remote(name, events_dir(data_dir, name),
                                                        list(names), window_s)
             for name, names in plan.reads.items()]

    def ready() -> NewEvents:
        try:
            done = ray.get([info for info, _, _ in reads], timeout=READ_TIMEOUT_S)
            cells = tuple(c for r, (_, c, _) in zip(done, reads) if r.events)
            # the timeline rows are few (decisions, flood steps): gathered here, one table
            marks = ray.get([t for r, (_, _, t) in zip(done, reads) if r.events],
                            timeout=READ_TIMEOUT_S)
        except ray.exceptions.RayError as err:
            raise _failed(err) from err
        return NewEvents(plan.files, plan.again, cells, timeline_blocks(marks), tuple(done))
    return NewEvents(plan.files, plan.again, pending=ready)


def _failed(err: Exception) -> RuntimeFailure:
    return RuntimeFailure(f"reading the data nodes' events failed: "
                          f"{str(err).splitlines()[0][:300]}")


async def unshipped_events(config: Config, data_dir: str, node: str, to: str,
                           ship: bool) -> int:
    """How many of alive data node ``node``'s event files the local events folder ``to``
    lacks; with ``ship``, they are copied there first, keeping their names (reads run
    on ``node``, writes in this process). Nothing to ship when events are off, go to
    the events URI, or the node is gone. A failed read leaves the files counted."""
    found = next((n for n in data_nodes(config) if n.name == node), None)
    if found is None or not config.analytics.events or config.analytics.events_uri:
        return 0
    root = events_dir(data_dir, node)
    names: list[str] = []
    try:
        names = [name for name in await _listed.options(**pinned(found)).remote(root)
                 if not os.path.exists(os.path.join(to, *name.split("/")))]
        if not ship:
            return len(names)
        while names:
            chunk = names[:SHIP_FILES_PER_CALL]
            files = await _file_bytes.options(**pinned(found)).remote(root, chunk)
            await asyncio.to_thread(write_shipped, to, files)
            del names[:len(chunk)]
        return 0
    except ray.exceptions.RayError:
        return max(len(names), 1)  # counted as left: the next poll tries again
