"""The report over three data nodes on a simulated cluster (ray.cluster_utils.Cluster),
run as its own process by tests/integration/test_event_nodes.py; prints JSON lines.

Each data node keeps its events in its own folder; the report reads each node's on
that node, a drained node's events still count after it left (its folder deleted),
and with an events URI every writer shares one folder the report reads.
"""

import json
import os
import shutil
import sys
import tempfile
import threading
import time

import pyarrow.parquet as pq
import ray
from ray.cluster_utils import Cluster

import rayq
from rayq.analytics.sources import list_event_files, read_event_files
from rayq.config import AnalyticsConfig, Config, ConsumerConfig, ScalingConfig, StoreConfig

NODES = ("n1", "n2", "n3")


def step(what: str) -> None:
    print(f"[+{time.monotonic() - BEGAN:.1f}s] {what}", file=sys.stderr, flush=True)


def start(data_dir: str, **analytics):
    config = Config(store=StoreConfig(shards=3), consumers=ConsumerConfig(count=0),
                    scaling=ScalingConfig(max_subqueues=3),
                    analytics=AnalyticsConfig(flush_interval_s=3600, **analytics))  # report flushes
    client = rayq.start(data_dir=data_dir, config=config)
    return client, client.create_queue("spread", subqueues=3, max_receives=None)


def send(queue, per_thread: int, tag: str) -> int:
    """Three threads each send one batch of ``per_thread`` messages of 10 tenants: a batch
    that large takes a lane of its own, so the three land on the queue's three shards."""
    sent = []

    def one(thread: int) -> None:
        sent.append(len(queue.send_batch([
            rayq.Outgoing(f"{tag}-{thread}-{i}", tenant=f"t{thread * 10 + i % 10}")
            for i in range(per_thread)])))
    threads = [threading.Thread(target=one, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(sent)


def on_disk(root: str) -> dict[str, int]:
    """Each event file under ``root`` by name, with its events (this test's own look at
    the disks, the ground truth the report is held to)."""
    return {name: pq.ParquetFile(os.path.join(root, name)).metadata.num_rows
            for name in list_event_files(root)}


def enqueues(root: str) -> int:
    return read_event_files(root, list_event_files(root)).column("kind").to_pylist().count(
        "enqueue")


def summary(result) -> dict:
    [row] = pq.read_table(result.tables["summary"]).to_pylist()
    return {"events": row["events"], "tenants": row["tenants"]}


def reads(result, node_ids: dict[str, str]) -> list:
    """Each read of the report: its source, and whether it ran on that source's node."""
    return [[r.source, r.ran_on == node_ids.get(r.source), r.files, r.events]
            for r in result.reads]


def per_node(data_dir: str) -> None:
    client, queue = start(data_dir, idle_stop_s=IDLE_STOP_S)
    node_ids = {n["Labels"]["rayq-data-node"]: n["NodeID"] for n in ray.nodes()
                if n["Alive"] and "rayq-data-node" in n.get("Labels", {})}
    sent = send(queue, 100, "a")
    step(f"sent {sent}")
    first = client.report(os.path.join(data_dir, "out-1"))
    step("first report")
    roots = {node: os.path.join(data_dir, node, "events") for node in NODES}
    disks = {node: on_disk(root) for node, root in roots.items()}
    print(json.dumps({
        "phase": "first", "sent": sent, "summary": summary(first),
        "truth": sum(rows for files in disks.values() for rows in files.values()),
        "enqueues_by_node": {node: enqueues(root) for node, root in roots.items()},
        "reads": reads(first, node_ids),
        "page_here": os.path.isfile(os.path.join(data_dir, "out-1", "report.html")),
        "shards": {s.index: s.node for s in client.stats()}}), flush=True)

    # events n3 wrote that no report has read yet, then n3 drained and removed
    sent_more = send(queue, 70, "b")
    client.flush_events()
    left = client.drain("n3", wait_s=300)
    step(f"drained n3: {left}")
    n3_files = on_disk(roots["n3"])
    shipped = set(n3_files) <= set(on_disk(roots["n1"])) | set(on_disk(roots["n2"]))
    between = client.report(os.path.join(data_dir, "out-2"))  # n3 still up: each file once
    step("report while n3 holds its files and their copies are on another node")
    truth_between = sum({**on_disk(roots["n1"]), **on_disk(roots["n2"]),
                         **on_disk(roots["n3"])}.values())
    spark_stopped()  # RayDP does not replace an executor a removed node took with it
    cluster.remove_node(NODE_HANDLES["n3"], allow_graceful=False)
    for _ in range(3):
        shutil.rmtree(os.path.join(data_dir, "n3"), ignore_errors=True)
        time.sleep(0.5)
    after = client.report(os.path.join(data_dir, "out-3"))
    step("report after n3 left")
    print(json.dumps({
        "phase": "drain", "sent": sent + sent_more, "left": left, "shipped": shipped,
        "n3_files": len(n3_files), "n3_gone": not os.path.exists(os.path.join(data_dir, "n3")),
        "between": summary(between), "truth_between": truth_between,
        "after": summary(after),
        "truth_after": sum({**on_disk(roots["n1"]), **on_disk(roots["n2"])}.values()),
        "enqueues_after": enqueues(roots["n1"]) + enqueues(roots["n2"]),
        "reads_after": reads(after, node_ids)}), flush=True)
    rayq.shutdown()


def spark_stopped(timeout_s: float = 300.0) -> None:
    """Until the idle analytics actor has stopped its Spark and left (after IDLE_STOP_S):
    the report after n3's removal then starts a Spark of its own on the nodes left."""
    from actors.analytics import stats
    from rayq.errors import RuntimeFailure

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stats()
        except RuntimeFailure:
            step("the analytics actor retired")
            return
        time.sleep(0.5)
    raise TimeoutError("the analytics actor did not retire")


def shared(data_dir: str) -> None:
    folder = os.path.join(data_dir, "shared-events")
    client, queue = start(os.path.join(data_dir, "shared-runtime"),
                          events_uri=f"file://{folder}")
    sent = send(queue, 64, "c")
    result = client.report(os.path.join(data_dir, "out-shared"))
    node_events = [os.path.join(data_dir, "shared-runtime", node, "events") for node in NODES[:2]]
    print(json.dumps({
        "phase": "shared", "sent": sent, "summary": summary(result),
        "truth": sum(on_disk(folder).values()), "enqueues": enqueues(folder),
        "node_folders_empty": not any(os.path.exists(p) for p in node_events),
        "reads": [r.source for r in result.reads]}), flush=True)
    rayq.shutdown()


def main() -> None:
    global cluster
    # The data nodes hold no CPU, as in the shipped cluster.yaml: Spark's executor runs on
    # the head. RayDP's own actors ask for no CPU and may still land on a data node; if
    # one sat on the node removed below, a warm Spark would lose its executor with it
    # (RayDP does not replace it), so the analytics actor retires before the removal.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for name in NODES:
        NODE_HANDLES[name] = cluster.add_node(num_cpus=0, resources={"rayq_data": 1},
                                              labels={"rayq-data-node": name})
    ray.init(address=cluster.address, namespace="rayq", log_to_driver=False)
    data_dir = tempfile.mkdtemp(prefix="rayq-event-nodes-")
    try:
        per_node(data_dir)
        shared(data_dir)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(data_dir, ignore_errors=True)


IDLE_STOP_S = 5.0  # the analytics actor retires this long after a report
BEGAN = time.monotonic()
NODE_HANDLES: dict = {}
cluster = None

if __name__ == "__main__":
    sys.exit(main())
