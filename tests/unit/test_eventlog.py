"""The event log's column path for enqueues: one event per message, without a dict each,
written beside the dict events of the same hour."""

import datetime as dt
import subprocess
import sys

from rayq.analytics.eventlog import EventLog, read_events
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.codec.wire import encode_messages
from rayq.core.kit.kv import LmdbKV
from rayq.core.storage.ledger import Enqueued
from rayq.core.storage.store import ShardStore
from rayq.core.storage.writes import Put

HOUR_END = dt.datetime(2026, 11, 22, 17, 59, 59, 500_000, tzinfo=dt.timezone.utc).timestamp()


def test_enqueue_groups_become_one_event_per_message_with_their_ids(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    groups = [Enqueued(HOUR_END, 3, "render", "acme", "render", range(0x10, 0x13)),
              Enqueued(HOUR_END + 1.0, 4, "mail", "zeta", "mail", (0xff, 0x100))]
    log.append_enqueues(lambda seq: f"ab12-{seq:x}", groups)  # the second: the next hour
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


def test_an_enqueue_carries_the_time_and_hour_a_dict_event_of_that_moment_does(tmp_path):
    moments = [HOUR_END, HOUR_END + 0.5, 1_764_400_000.123_456_7, 1_764_403_199.999_999_4,
               1_700_000_000.000_000_5]
    log = EventLog(tmp_path, "shard-0")
    log.append_enqueues(lambda seq: f"ab12-{seq:x}",
                        [Enqueued(ts, 1, "t", "a", "t", (n,)) for n, ts in enumerate(moments)])
    for n, ts in enumerate(moments):
        log.append("completion", ts, message_id=f"ab12-{n:x}")
    log.flush()
    by_kind: dict[str, dict[str, dt.datetime]] = {}
    for event in read_events(tmp_path).to_pylist():
        by_kind.setdefault(event["kind"], {})[event["message_id"]] = event["ts"]
    assert by_kind["enqueue"] == by_kind["completion"] and len(by_kind["enqueue"]) == 5
    partitions = {p.parent.parent.name + "/" + p.parent.name: len(read_events(p.parent))
                  for p in tmp_path.rglob("*.parquet")}
    assert sum(partitions.values()) == 10 and all(n % 2 == 0 for n in partitions.values())


def test_nothing_buffered_writes_nothing(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    log.append_enqueues(lambda seq: f"ab12-{seq:x}", [])
    assert log.flush() == 0 and not list(tmp_path.rglob("*.parquet"))


def test_each_message_of_a_put_mixing_attributes_is_logged_under_its_own_id(tmp_path):
    """A put's messages take seqs in the order sent, so an attribute group's seqs need not
    follow each other: alternating tenants interleave them."""
    store = ShardStore(LmdbKV(tmp_path / "store"))
    store.keep_enqueued = True
    sent = [NewMessage(encode_body(f"m{i}", 1 << 20), f"t{i % 2}", "mail", f"t{i % 2}")
            for i in range(6)]
    ids = store.run(Put(1, encode_messages(sent)))
    log = EventLog(tmp_path / "events", "shard-0")
    log.append_enqueues(*store.take_enqueued())
    assert log.flush() == 6
    logged = {e["message_id"]: e["tenant"] for e in read_events(tmp_path / "events").to_pylist()}
    assert logged == {mid: f"t{i % 2}" for i, mid in enumerate(ids)}
    store.close()


WITHOUT_PANDAS = """
import sys
from rayq.analytics.eventlog import EventLog, arrow_without_pandas, read_events
from rayq.core.storage.ledger import Enqueued
arrow_without_pandas()
log = EventLog(sys.argv[1], "shard-0")
log.append_enqueues(lambda seq: f"ab12-{seq:x}", [Enqueued(1.7e9, 3, "mail", "acme", "mail", range(2))])
log.append("completion", 1.7e9, tenant="acme", message_id="ab12-0", outcome="succeeded")
assert log.flush() == 3
assert "pandas" not in sys.modules, "pandas imported"
assert len(read_events(sys.argv[1]).to_pandas()) == 3  # still there when asked for
"""


def test_an_actor_writes_events_without_importing_pandas(tmp_path):
    # pyarrow imports pandas (42 MiB) on the first array it builds, unless told not to;
    # the check runs in a fresh interpreter, where nothing imported pandas yet
    done = subprocess.run([sys.executable, "-c", WITHOUT_PANDAS, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
