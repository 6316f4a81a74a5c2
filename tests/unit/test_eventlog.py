"""The event log's column path for enqueues: one event per message, without a dict each,
written beside the dict events of the same hour."""

import datetime as dt

from rayq.analytics.eventlog import EventLog, read_events
from rayq.core.storage.ledger import Enqueued

HOUR_END = dt.datetime(2026, 11, 22, 17, 59, 59, 500_000, tzinfo=dt.timezone.utc).timestamp()


def test_enqueue_groups_become_one_event_per_message_with_their_ids(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    groups = [Enqueued(HOUR_END, 3, "render", "acme", "render", 0x10, 3),
              Enqueued(HOUR_END + 1.0, 4, "mail", "zeta", "mail", 0xff, 2)]  # the next hour
    log.append_enqueues(lambda seq: f"ab12-{seq:x}", groups)
    log.append("completion", HOUR_END, tenant="acme", type="render", key="render",
               message_id="ab12-10", usage_s=0.5, outcome="succeeded", attempt=1)
    assert log.pending() == 6
    assert log.flush() == 6 and log.pending() == 0
    events = read_events(tmp_path).to_pylist()
    enqueues = sorted((e["message_id"], e["subqueue"], e["tenant"], e["type"], e["key"],
                       e["ts"].hour) for e in events if e["kind"] == "enqueue")
    assert enqueues == [("ab12-10", 3, "acme", "render", "render", 17),
                        ("ab12-100", 4, "zeta", "mail", "mail", 18),
                        ("ab12-11", 3, "acme", "render", "render", 17),
                        ("ab12-12", 3, "acme", "render", "render", 17),
                        ("ab12-ff", 4, "zeta", "mail", "mail", 18)]
    [done] = [e for e in events if e["kind"] == "completion"]
    assert done["usage_s"] == 0.5 and done["subqueue"] is None
    assert all(e["usage_s"] is None for e in events if e["kind"] == "enqueue")
    partitions = sorted(p.parent.name for p in tmp_path.rglob("*.parquet"))
    assert partitions == ["hour=17", "hour=18"]  # each hour's events in one file


def test_nothing_buffered_writes_nothing(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    log.append_enqueues("ab12-", [])
    assert log.flush() == 0 and not list(tmp_path.rglob("*.parquet"))
