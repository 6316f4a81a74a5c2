"""Which event files a report reads, and where: each file once, by name, wherever it lies
(a node's own folder, a drained node's files shipped elsewhere, or an events URI)."""

import pytest

from rayq.analytics.eventlog import EventLog, read_events
from rayq.analytics.sources import (list_event_files, local_events, plan_reads,
                                    read_event_files, read_file_bytes, write_shipped)
from rayq.config import AnalyticsConfig, Config
from rayq.errors import ConfigError

A, B, C = "date=2026-11-28/hour=01/part-shard-0-a.parquet", \
    "date=2026-11-28/hour=01/part-shard-1-b.parquet", "date=2026-11-28/hour=02/part-flood-c.parquet"


@pytest.mark.parametrize("listings, known, reads, again", [
    # each node's new files, read on that node
    ({"n1": [A], "n2": [B], "n3": [C]}, set(), {"n1": (A,), "n2": (B,), "n3": (C,)}, False),
    # files read before are not read again
    ({"n1": [A], "n2": [B], "n3": [C]}, {A, B}, {"n3": (C,)}, False),
    # a drained node's file shipped to n1 while n3 still holds it: read once, by n1
    ({"n1": [A, C], "n3": [C]}, set(), {"n1": (A, C)}, False),
    # ... and once n3 left, the shipped copy is the file read before: nothing new
    ({"n1": [A, C], "n2": [B]}, {A, B, C}, {}, False),
    # a file read before is gone (its node left undrained): read everything again
    ({"n1": [A], "n2": [B]}, {A, B, C}, {"n1": (A,), "n2": (B,)}, True),
    ({}, set(), {}, False),
])
def test_each_new_file_is_read_once_by_the_first_source_that_holds_it(listings, known, reads,
                                                                       again):
    plan = plan_reads(listings, frozenset(known))
    assert plan.reads == reads and plan.again is again
    assert plan.files == {name for names in listings.values() for name in names}


def written(root, writer: str, tenants: list[str]) -> None:
    log = EventLog(root, writer)
    for tenant in tenants:
        log.append("completion", 1_796_000_000.0, tenant=tenant, usage_s=0.1, outcome="succeeded")
    assert log.flush() == len(tenants)


def test_files_are_listed_by_their_name_under_the_root_and_read_by_name(tmp_path):
    written(tmp_path / "n1", "shard-0", ["a", "b"])
    written(tmp_path / "n1", "flood", ["c"])
    names = list_event_files(tmp_path / "n1")
    assert len(names) == 2 and all(n.startswith("date=") and "/hour=" in n for n in names)
    assert list_event_files(tmp_path / "missing") == []
    table = read_event_files(tmp_path / "n1", names[:1])
    assert table.num_rows in (1, 2) and table.schema.names[0] == "schema_version"
    new = local_events(str(tmp_path / "n1"), frozenset(names[:1]), 60.0).ready()
    assert new.files == set(names) and new.events == 3 - table.num_rows and not new.again


def test_shipped_files_keep_their_names_and_are_written_once(tmp_path):
    written(tmp_path / "n3", "shard-2", ["a", "b", "c"])
    names = list_event_files(tmp_path / "n3")
    files = read_file_bytes(tmp_path / "n3", names)
    assert write_shipped(str(tmp_path / "n1"), files) == 1
    assert write_shipped(str(tmp_path / "n1"), files) == 0  # shipped before: left alone
    assert list_event_files(tmp_path / "n1") == names
    assert read_events(tmp_path / "n1").to_pylist() == read_events(tmp_path / "n3").to_pylist()
    assert oct((tmp_path / "n1" / names[0]).stat().st_mode & 0o777) == "0o600"


def test_writers_sharing_an_events_uri_are_all_read_from_it(tmp_path):
    uri = f"file://{tmp_path}/shared"
    written(uri, "shard-0", ["a"])
    written(uri, "shard-0", ["b"])  # a shard of the same index on another node
    written(uri, "coordinator", ["c", "d"])
    assert len(list_event_files(uri)) == 3
    assert sorted(read_events(uri).column("tenant").to_pylist()) == ["a", "b", "c", "d"]
    assert not list(tmp_path.rglob(".*.tmp"))  # written, then renamed


@pytest.mark.parametrize("uri", ["", "/shared/events", "shared", 7, "s3://",
                                 "nosuchscheme://bucket/events", "file:// spaced"])
def test_an_events_uri_must_name_a_file_system(uri):
    with pytest.raises(ConfigError):
        Config(analytics=AnalyticsConfig(events_uri=uri))


def test_an_events_uri_pyarrow_cannot_open_is_refused_when_read():
    with pytest.raises(ConfigError):
        list_event_files("nosuchscheme://bucket/events")


def test_a_file_uri_and_an_s3_uri_are_accepted():
    for uri in ("file:///mnt/shared/rayq-events", "s3://bucket/rayq-events"):
        assert Config(analytics=AnalyticsConfig(events_uri=uri)).analytics.events_uri == uri
