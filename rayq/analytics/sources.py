"""Where a report's events come from, and which of them are new.

An event file is named by its path under its events root
(``date=YYYY-MM-DD/hour=HH/part-<writer>-<id>.parquet``). It is written once and
never changed, and its name is unique (a random id), so the name says what it holds
wherever it lies: a file shipped off a drained node keeps its name on the node that
took it, and is read once. A root is a local folder (each data node's
``<data_dir>/<node>/events``, read only on that node) or a pyarrow file system URI
(``AnalyticsConfig.events_uri``: ``file:///shared/rayq-events``, ``s3://bucket/rayq``).

The report lists every source, plans which new files each reads (:func:`plan_reads`),
and each source's reader aggregates them, one file at a time, into the report's cells
and timeline rows (:func:`aggregate_event_files`; actors/event_reads.py runs the
readers on the nodes that hold the files).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayq.analytics.cells import (CELL_SCHEMA, TIMELINE_SCHEMA, merge_cells, partial_cells,
                                  timeline_of)
from rayq.analytics.schema import EVENT_SCHEMA, FIELDS
from rayq.core.kit.private import FILE_MODE, make_private_dir
from rayq.errors import ConfigError



def is_uri(root: str) -> bool:
    return "://" in root


def events_filesystem(root: str | os.PathLike) -> tuple[pafs.FileSystem, str]:
    """(pyarrow file system, path in it) of an events root: a local folder or a URI.
    Raises ConfigError for a URI pyarrow cannot open."""
    root = os.fspath(root)
    if not is_uri(root):
        return pafs.LocalFileSystem(), os.path.abspath(root)
    try:
        return pafs.FileSystem.from_uri(root)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        raise ConfigError(f"cannot open the events URI {root!r}: {err}") from err


def list_event_files(root: str | os.PathLike) -> list[str]:
    """The finished event files under ``root``, as names relative to it, sorted (none
    when it does not exist; files being written start with a dot)."""
    fs, base = events_filesystem(root)
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    names = []
    for info in infos:
        if info.type == pafs.FileType.File and info.base_name.endswith(".parquet") \
                and not info.base_name.startswith("."):
            names.append(os.path.relpath(info.path, base).replace(os.sep, "/"))
    return sorted(names)


def read_event_files(root: str | os.PathLike, names: Sequence[str]) -> pa.Table:
    """The events of files ``names`` (relative to ``root``) as one table of EVENT_SCHEMA,
    each column in one chunk (RayDP's conversion to Spark takes no chunked columns)."""
    return concat_event_files(root, names).combine_chunks()


def concat_event_files(root: str | os.PathLike, names: Sequence[str]) -> pa.Table:
    """The events of files ``names`` (relative to ``root``), one chunk per file."""
    if not names:
        return EVENT_SCHEMA.empty_table()
    fs, base = events_filesystem(root)
    return pa.concat_tables(
        pq.read_table(f"{base}/{name}", schema=EVENT_SCHEMA, filesystem=fs).select(FIELDS)
        for name in names)


def read_file_bytes(root: str | os.PathLike, names: Sequence[str]) -> list[tuple[str, bytes]]:
    """(name, bytes) of each file ``names`` under ``root``: a drained node's files, to
    ship as they are."""
    fs, base = events_filesystem(root)
    out = []
    for name in names:
        with fs.open_input_stream(f"{base}/{name}") as f:
            out.append((name, f.read()))
    return out


def write_shipped(root: str, files: Sequence[tuple[str, bytes]]) -> int:
    """Write files shipped from another node under local folder ``root``, keeping their
    names; a name already there is left alone (shipped before). Returns how many
    were written. Each lands whole (write, then rename), readable by its owner alone."""
    written = 0
    for name, data in files:
        path = os.path.join(root, *name.split("/"))
        if os.path.exists(path):
            continue
        make_private_dir(os.path.dirname(path))
        tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
        written += 1
    return written


@dataclass(frozen=True)
class ReadPlan:
    """reads: per source, the new file names it reads; files: every file name listed;
    again: a file read before has gone, so everything is read again."""

    reads: dict[str, tuple[str, ...]]
    files: frozenset[str]
    again: bool


def plan_reads(listings: Mapping[str, Sequence[str]], known: frozenset[str]) -> ReadPlan:
    """Which source reads which file: each file not in ``known`` is read once, by the
    first source (by name) that lists it. When a file of ``known`` is listed by no
    source (deleted, or its node left undrained), the held events no longer match the
    files: every file is read again."""
    files = frozenset(name for names in listings.values() for name in names)
    again = not known <= files
    taken = set() if again else set(known)
    reads = {}
    for source in sorted(listings):
        mine = tuple(name for name in sorted(set(listings[source])) if name not in taken)
        taken.update(mine)
        if mine:
            reads[source] = mine
    return ReadPlan(reads, files, again)


@dataclass(frozen=True)
class EventRead:
    """One source's read: its name (a data node's, or the events URI), the Ray node
    the read ran on, how many files and events it read."""

    source: str
    ran_on: str
    files: int
    events: int


@dataclass(frozen=True)
class Aggregated:
    """One source's new events, aggregated where they were read: their ``cells``
    (rayq.analytics.cells.CELL_SCHEMA) and ``timeline`` rows (TIMELINE_SCHEMA)."""

    read: EventRead
    cells: pa.Table
    timeline: pa.Table


def aggregate_event_files(root: str | os.PathLike, names: Sequence[str], window_s: float,
                          source: str, ran_on: str = "") -> Aggregated:
    """The events of files ``names`` under ``root`` as cells and timeline rows, read one
    file at a time (a combiner: only aggregates leave the node, and one file's raw
    events are held at once, whatever the log's size)."""
    parts, marks, events = [], [], 0
    for name in names:
        table = read_event_files(root, [name])
        events += table.num_rows
        if table.num_rows:
            parts.append(partial_cells(table, window_s))
            marks.append(timeline_of(table))
    cells = merge_cells(pa.concat_tables(parts)) if parts else CELL_SCHEMA.empty_table()
    timeline = pa.concat_tables(marks).combine_chunks() if marks else TIMELINE_SCHEMA.empty_table()
    return Aggregated(EventRead(source, ran_on, len(names), events),
                      cells.combine_chunks(), timeline)


@dataclass(frozen=True)
class NewEvents:
    """What a report adds to what it holds: files: every event file name there is now;
    again: drop what is held first; cells and timeline: the new events' aggregates,
    Arrow tables (or Ray object refs of them), one per source that had new events;
    reads: one EventRead per source read. ``pending``: the reads still run, and
    :meth:`ready` waits for them (a report starts Spark meanwhile)."""

    files: frozenset[str]
    again: bool = False
    cells: tuple = ()
    timeline: tuple = ()
    reads: tuple[EventRead, ...] = ()
    pending: Callable[[], "NewEvents"] | None = None

    @property
    def events(self) -> int:
        return sum(r.events for r in self.reads)

    def ready(self) -> "NewEvents":
        """These new events with their reads done."""
        return self.pending() if self.pending else self


def local_events(root: str, known: frozenset[str], window_s: float,
                 ran_on: str = "") -> NewEvents:
    """The new events of one root, read and aggregated in this process (a report run by
    hand, or the events URI read by the analytics actor)."""
    plan = plan_reads({root: list_event_files(root)}, known)

    def read() -> NewEvents:
        done = aggregate_event_files(root, plan.reads.get(root, ()), window_s, root, ran_on)
        return NewEvents(plan.files, plan.again, (done.cells,) if done.read.events else (),
                         timeline_blocks([done.timeline]), (done.read,))
    return NewEvents(plan.files, plan.again, pending=read)


def timeline_blocks(tables: Sequence[pa.Table]) -> tuple:
    """The timeline rows of ``tables`` as one block, or none when there are none
    (RayDP takes no empty table)."""
    rows = pa.concat_tables([TIMELINE_SCHEMA.empty_table(), *tables]).combine_chunks()
    return (rows,) if rows.num_rows else ()
