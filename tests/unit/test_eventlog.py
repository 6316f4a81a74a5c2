"""The event log's column path for enqueues: one event per message, without a dict each,
written beside the dict events of the same hour."""

import datetime as dt
import subprocess
import sys

from rayq.analytics.eventlog import EventLog, read_events
from rayq.core.codec.model import NewMessage, encode_body
from rayq.core.codec.wire import attrs_of, encode_messages, encode_put
from rayq.core.kit.kv import LmdbKV
from rayq.core.storage.ledger import Enqueued
from rayq.core.storage.store import ShardStore
from rayq.core.storage.writes import Put

HOUR_END = dt.datetime(2026, 11, 22, 17, 59, 59, 500_000, tzinfo=dt.timezone.utc).timestamp()


def test_enqueue_groups_become_one_event_per_message_with_their_ids(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    groups = [Enqueued(HOUR_END, 3, "render", "acme", "render", ["ab12-10", "ab12-11", "ab12-12"]),
              Enqueued(HOUR_END + 1.0, 4, "mail", "zeta", "mail", ["ab12-ff", "ab12-100"])]
    log.append_enqueues(groups)  # the second: the next hour
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
    log.append_enqueues([Enqueued(ts, 1, "t", "a", "t", [f"ab12-{n:x}"])
                         for n, ts in enumerate(moments)])
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


def test_enqueues_of_many_puts_are_built_a_chunk_at_a_time_and_all_logged(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    groups = [Enqueued(HOUR_END + n * 0.25, n, "mail", f"t{n}", "mail",
                       [f"ab12-{n}-{i}" for i in range(1500 + n)]) for n in range(8)]
    log.append_enqueues(groups)  # hour 17: two groups, one chunk; hour 18: six, two chunks
    assert len(log._tables) == 3
    assert log.flush() == sum(g.count for g in groups)
    logged = [(e["message_id"], e["subqueue"], e["tenant"]) for e in read_events(tmp_path).to_pylist()]
    assert sorted(logged) == sorted((mid, g.subqueue, g.tenant) for g in groups for mid in g.ids)

def test_nothing_buffered_writes_nothing(tmp_path):
    log = EventLog(tmp_path, "shard-0")
    log.append_enqueues([])
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
    log.append_enqueues(store.take_enqueued())
    assert log.flush() == 6
    logged = {e["message_id"]: e["tenant"] for e in read_events(tmp_path / "events").to_pylist()}
    assert logged == {mid: f"t{i % 2}" for i, mid in enumerate(ids)}
    store.close()



def test_a_put_naming_a_task_stored_before_logs_only_its_new_messages(tmp_path):
    """A task submitted again answers with its first id and is not enqueued again; the
    new messages around it keep their own ids, in the answer and in the log."""
    store = ShardStore(LmdbKV(tmp_path / "store"))
    store.keep_enqueued = True
    attrs = [attrs_of(NewMessage(encode_body("t", 1 << 20), tenant, "job", tenant, task=True))
             for tenant in ("t0", "t1")]
    [first] = store.run(Put(1, encode_put([(attrs[0], b"x", "task-a")])))
    store.take_enqueued()
    again = store.run(Put(1, encode_put([(attrs[1], b"x", "task-b"), (attrs[0], b"x", "task-a"),
                                         (attrs[0], b"x", "task-c"), (attrs[1], b"x", "task-d")])))
    assert again[1] == first and len(set(again)) == 4
    log = EventLog(tmp_path / "events", "shard-0")
    log.append_enqueues(store.take_enqueued())
    assert log.flush() == 3
    logged = {e["message_id"]: e["tenant"] for e in read_events(tmp_path / "events").to_pylist()}
    assert logged == {again[0]: "t1", again[2]: "t0", again[3]: "t1"}
    store.close()

WITHOUT_PANDAS = """
import sys
from rayq.analytics.eventlog import EventLog, arrow_without_pandas, read_events
from rayq.core.storage.ledger import Enqueued
arrow_without_pandas()
log = EventLog(sys.argv[1], "shard-0")
log.append_enqueues([Enqueued(1.7e9, 3, "mail", "acme", "mail", ["ab12-0", "ab12-1"])])
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
