"""Append-only event log: buffered records written as Arrow record batches to
Parquet files under ``<root>/date=YYYY-MM-DD/hour=HH/``.

Appending only adds a dict to a list: the hot path never touches the disk. Enqueues,
one event per message, come in groups (a put's messages of the same attributes) and
are kept as Arrow columns: no dict per message, in memory or in CPU.
``flush()`` (called by the owning actor every few seconds, off its event loop)
writes one file per (date, hour) and writer, atomically (write, then rename).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import os
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayq.analytics.schema import EVENT_SCHEMA, FIELDS, KINDS, SCHEMA_VERSION
from rayq.analytics.sources import concat_event_files, events_filesystem, is_uri, list_event_files
from rayq.core.kit.private import FILE_MODE, make_private_dir

MAX_BUFFERED = 200_000   # past this, appends flush inline rather than grow without bound


class EventLog:
    """One writer's events (a shard, the coordinator, the flood detector)."""

    enabled = True

    def __init__(self, root: str | os.PathLike, writer: str):
        self.root, self.writer = os.fspath(root), writer
        self._rows: list[dict] = []
        self._tables: list[tuple[str, pa.Table]] = []  # (partition, events as columns)
        self._buffered = 0
        self._lock = threading.Lock()
        self.written = 0

    def append(self, kind: str, ts: float, **fields) -> None:
        """Buffer one event; ``ts`` in seconds since the epoch. Unknown fields are refused."""
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown event fields {sorted(unknown)}")
        row = {"schema_version": SCHEMA_VERSION, "kind": kind, "ts": ts, **fields}
        with self._lock:
            self._rows.append(row)
            self._buffered += 1
            full = self._buffered >= MAX_BUFFERED
        if full:
            self.flush()

    def append_enqueues(self, groups: Sequence) -> None:
        """Buffer one ``enqueue`` event per message of ``groups`` (``Enqueued``: at,
        subqueue, type, tenant, key, ids), as columns.

        A shard calls this on a thread with seconds of puts at once: the columns are
        built ENQUEUE_CHUNK messages at a time, and the GIL is let go between chunks (a
        run of Arrow conversions holds it throughout, and the shard's requests would
        wait tens of ms behind 50 000 messages' worth)."""
        tables = []
        for partition, chunk in _chunks(groups):
            tables.append((partition, _enqueue_table(chunk)))
            time.sleep(0)
        with self._lock:
            self._tables.extend(tables)
            self._buffered += sum(t.num_rows for _, t in tables)
            full = self._buffered >= MAX_BUFFERED
        if full:
            self.flush()

    def pending(self) -> int:
        return self._buffered

    def flush(self) -> int:
        """Write what is buffered; returns how many events were written."""
        with self._lock:
            rows, self._rows = self._rows, []
            tables, self._tables = self._tables, []
            self._buffered = 0
        if not rows and not tables:
            return 0
        by_hour: dict[str, list[pa.Table]] = defaultdict(list)
        for partition, table in tables:
            by_hour[partition].append(table)
        dicts: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            row["ts"] = _moment(row["ts"])
            dicts[_partition(row["ts"])].append(row)
        for partition, part in dicts.items():
            by_hour[partition].append(pa.Table.from_pylist(part, schema=EVENT_SCHEMA))
        written = 0
        for partition, parts in by_hour.items():
            name = f"part-{self.writer}-{uuid.uuid4().hex[:12]}.parquet"
            table = pa.concat_tables(parts)
            if is_uri(self.root):
                _write_to_uri(self.root, partition, name, table)
            else:
                folder = os.path.join(self.root, partition)
                make_private_dir(folder)
                tmp = os.path.join(folder, "." + name + ".tmp")
                pq.write_table(table, tmp)
                os.chmod(tmp, FILE_MODE)  # events name tenants and types: the owner's alone
                os.replace(tmp, os.path.join(folder, name))  # readers never see a half file
            written += table.num_rows
        self.written += written
        return written


def _write_to_uri(root: str, partition: str, name: str, table: pa.Table) -> None:
    """One event file under the events URI ``root``: on a local or shared folder written,
    then renamed, as in a node's own folder; in an object store put whole (a put is
    seen whole or not at all)."""
    fs, base = events_filesystem(root)
    folder = f"{base}/{partition}"
    fs.create_dir(folder, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{folder}/.{name}.tmp"
        pq.write_table(table, tmp, filesystem=fs)
        fs.move(tmp, f"{folder}/{name}")
    else:
        pq.write_table(table, f"{folder}/{name}", filesystem=fs)


def _moment(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc)


def _micros(ts: float) -> int:
    """``_moment(ts)`` in µs since the epoch, without a datetime: rounded as
    ``datetime.fromtimestamp`` rounds (the fraction alone, half to even)."""
    fraction, whole = math.modf(ts)
    return int(whole) * 1_000_000 + round(fraction * 1_000_000)


def _partition(moment: dt.datetime) -> str:
    return moment.strftime("date=%Y-%m-%d/hour=%H")


_HOURS: dict[int, str] = {}  # partition by hour since the epoch: formatted once each


def _partition_at(ts: float) -> str:
    """``_partition(_moment(ts))``, for every enqueue group of a put (a put from eight
    threads of eight tenants makes eight): the hour's name is formatted once."""
    hour = int(ts // 3600)
    name = _HOURS.get(hour)
    if name is None:
        if len(_HOURS) >= 48:
            _HOURS.clear()
        name = _HOURS[hour] = _partition(_moment(hour * 3600))
    return name


ENQUEUE_CHUNK = 4096  # enqueue events whose columns are built without letting go of the GIL


def _chunks(groups: Sequence) -> Iterator[tuple[str, list]]:
    """``groups`` by hour, in lists of about ENQUEUE_CHUNK messages (a group is not split)."""
    by_hour: dict[str, list] = defaultdict(list)
    for group in groups:
        by_hour[_partition_at(group.at)].append(group)
    for partition, part in by_hour.items():
        chunk, size = [], 0
        for group in part:
            chunk.append(group)
            size += group.count
            if size >= ENQUEUE_CHUNK:
                yield partition, chunk
                chunk, size = [], 0
        if chunk:
            yield partition, chunk


def _enqueue_table(groups: list) -> pa.Table:
    """One row per message of ``groups``, in EVENT_SCHEMA: each group's fields repeated
    ``count`` times (C-level list repetition) and its ids, which its put made. Nothing
    here runs Python per message: this runs on a thread of the shard, and a loop per
    message would hold the GIL from the shard's requests for tens of ms."""
    def repeated(field):
        return list(itertools.chain.from_iterable([field(g)] * g.count for g in groups))

    total = sum(g.count for g in groups)
    columns = {
        "schema_version": pa.array([SCHEMA_VERSION] * total, pa.int16()),
        "ts": pa.array(repeated(lambda g: _micros(g.at)), pa.timestamp("us", tz="UTC")),
        "kind": pa.array(["enqueue"] * total, pa.string()),
        "subqueue": pa.array(repeated(lambda g: g.subqueue), pa.int64()),
        "tenant": pa.array(repeated(lambda g: g.tenant), pa.string()),
        "type": pa.array(repeated(lambda g: g.type), pa.string()),
        "key": pa.array(repeated(lambda g: g.key), pa.string()),
        "message_id": pa.array(list(itertools.chain.from_iterable(g.ids for g in groups)),
                               pa.string()),
    }
    return pa.table([columns.get(f.name, pa.nulls(total, f.type)) for f in EVENT_SCHEMA],
                    schema=EVENT_SCHEMA)


class NoEventLog:
    """The event log of an actor when ``AnalyticsConfig.events`` is off: it keeps
    nothing, so actors append without asking whether the log is on."""

    enabled = False

    def append(self, kind: str, ts: float, **fields) -> None:
        pass

    def pending(self) -> int:
        return 0

    def flush(self) -> int:
        return 0


def read_events(root: str | os.PathLike) -> pa.Table:
    """Every event under ``root``, a folder or a URI (for tests and the pyarrow-only
    baseline)."""
    return concat_event_files(root, list_event_files(root))


class _NoPandas:
    """A module finder for which pandas is not installed (see :func:`arrow_without_pandas`)."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas":
            raise ModuleNotFoundError("pandas is kept out of this process", name=name)
        return None


def arrow_without_pandas() -> None:
    """Have pyarrow build this process's arrays without importing pandas.

    pyarrow imports pandas the first time it builds an array, to ask whether its input
    is a pandas object: 42 MiB of private memory and a quarter second of CPU, in an
    actor whose event log never holds one. Its first ask is answered here, with pandas
    not found, and pyarrow keeps that answer; a later ``to_pandas()`` or
    ``Table.from_pandas()`` in the process still imports pandas and works.
    :func:`open_event_log` calls it: only runtime actors, each in a process of its own,
    open an event log."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([], pa.int8())
    finally:
        sys.meta_path.remove(finder)


def open_event_log(data_dir: str, writer: str, config, collect=None) -> EventLog | NoEventLog:
    """The event log of one runtime actor under ``<data_dir>/events`` (its node's
    folder), or under ``config.events_uri`` when set, with its flushing task started
    on the running loop; a NoEventLog when ``config.events`` is off (an
    ``AnalyticsConfig``). ``collect`` gathers events kept elsewhere before each flush."""
    import asyncio

    if not config.events:
        return NoEventLog()
    arrow_without_pandas()
    log = EventLog(config.events_uri or os.path.join(data_dir, "events"), writer)
    asyncio.get_running_loop().create_task(flush_forever(log, config.flush_interval_s, collect))
    return log


async def flush_forever(log: EventLog, interval_s: float, collect=None) -> None:
    """Every ``interval_s``: ``await collect()`` (gather events kept elsewhere), then
    write the buffer off the event loop. Runs as a background task of an actor."""
    import asyncio

    while True:
        await asyncio.sleep(interval_s)
        try:
            if collect is not None:
                await collect()
            await asyncio.to_thread(log.flush)
        except OSError:
            pass  # disk trouble: the events stay buffered (bounded) and the next round retries


def log_decision(log: EventLog | NoEventLog, event: dict) -> None:
    """A fairness decision as an event; other coordinator records (suspensions) stay
    in its own history only."""
    if event["kind"] == "fairness":
        log.append("fairness", event["at"], detail=json.dumps(event),
                   outcome=decision_outcome(event))


def decision_outcome(event: dict) -> str:
    """A fairness decision's outcome column: "intervening", "fair", or "passive" for a
    decision to intervene that changed nothing (interventions were passive)."""
    if not event["intervening"]:
        return "fair"
    return "passive" if event.get("passive") else "intervening"


def log_report(log: EventLog, report) -> None:
    """A consumer's usage report as events: its completion or deferral, plus a
    redelivery when it was not the first attempt and a dead letter when it died."""
    fields = dict(queue=report.queue or None, tenant=report.tenant, type=report.type,
                  key=report.key, message_id=report.message_id or None, attempt=report.attempt)
    outcome = report.outcome.value
    if outcome == "deferred":
        cause = report.cause
        log.append("deferral", report.finished_at, wait_s=report.wait_s, outcome=outcome,
                   detail=cause.value if cause else None, **fields)
        return
    log.append("completion", report.finished_at, usage_s=report.usage_s, wait_s=report.wait_s,
               outcome=outcome, **fields)
    if report.attempt > 1:
        log.append("redelivery", report.finished_at, outcome=outcome, **fields)
    if outcome == "dead":
        log.append("dead_letter", report.finished_at, outcome=outcome, **fields)
