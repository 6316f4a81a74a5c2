"""The SQS endpoint over HTTP: boto3's batch cycle against rayq, moto and rayq's client.

    python benchmarks/sqs_http.py [--seconds 20] [--threads 1,8] [--replicas 2]

One cycle is send_message_batch(10) -> receive_message(10) -> delete_message_batch,
200-byte bodies, on each ``--threads`` count of threads sharing one queue (each
thread its own boto3 client). The same cycle runs, in this one run, against:
- rayq's SQS endpoint (``rayq.serve_sqs``, durable: every send, receive and delete
  is fsync'd), with boto3 signing as a rayq account;
- moto's server mode (``moto_server`` on a free loopback port), an in-memory SQS mock;
- rayq's own Python client (send_batch -> receive -> delete_batch), no HTTP.
Throughput counts deleted messages.
"""

from __future__ import annotations

import importlib.util
import os
import sys

# This file is named http.py: run as a script, its folder would shadow the standard
# library's http package (which boto3 and urllib need), so it leaves sys.path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

import boto3  # noqa: E402
import ray  # noqa: E402
from botocore.config import Config as BotoConfig  # noqa: E402

import rayq  # noqa: E402

_spec = importlib.util.spec_from_file_location("_report", os.path.join(_HERE, "_report.py"))
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)
report, run_threads, local_ray = _report.report, _report.run_threads, _report.local_ray

BATCH = 10
BODY = "x" * 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cycles(cycle, threads: int, seconds: float) -> tuple[float, float]:
    """(messages deleted per second, p50 cycle ms) of ``cycle(i)`` on ``threads`` threads."""
    stop = threading.Event()
    deleted, times = [0] * threads, [[] for _ in range(threads)]

    def loop(i: int) -> None:
        while not stop.is_set():
            start = time.perf_counter()
            deleted[i] += cycle(i)
            times[i].append(time.perf_counter() - start)

    elapsed = run_threads(loop, threads, seconds, stop)
    return sum(deleted) / elapsed, statistics.median(t for ts in times for t in ts) * 1000


def boto3_cycle(url: str, account: str, key: str, threads: int):
    """A cycle function over boto3 clients (one per thread: clients are not shared)."""
    config = BotoConfig(retries={"max_attempts": 0}, max_pool_connections=2)
    clients = [boto3.session.Session().client(
        "sqs", endpoint_url=url, region_name="us-east-1", aws_access_key_id=account,
        aws_secret_access_key=key, config=config) for _ in range(threads)]
    queue_url = clients[0].create_queue(QueueName="bench-http")["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": BODY} for i in range(BATCH)]

    def cycle(i: int) -> int:
        sqs = clients[i]
        sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=BATCH,
                                  VisibilityTimeout=60).get("Messages", [])
        if got:
            sqs.delete_message_batch(QueueUrl=queue_url, Entries=[
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)])
        return len(got)
    cycle(0)  # warm: the queue, connections, the endpoint's client and caches
    return cycle


def python_cycle(client: rayq.Client):
    queue = client.create_queue("bench-python", max_receives=None)
    batch = [rayq.Outgoing(BODY) for _ in range(BATCH)]

    def cycle(i: int) -> int:
        queue.send_batch(batch)
        got = queue.receive(max_messages=BATCH, visibility_timeout_s=60)
        if got:
            queue.delete_batch([m.receipt for m in got])
        return len(got)
    cycle(0)
    return cycle


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    binary = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto_server did not start")
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="per side and thread count")
    parser.add_argument("--threads", default="1,8", help="thread counts, comma-separated")
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    root = tempfile.mkdtemp(prefix="rayq-bench-http-")
    local_ray(num_cpus=2, namespace="rayq", include_dashboard=False, log_to_driver=False)
    moto, measured = None, {}
    try:
        client = rayq.start(data_dir=os.path.join(root, "data"), consumers=0)
        key = client.create_account("bench")
        url = rayq.serve_sqs(port=free_port(), replicas=args.replicas)
        moto, moto_url = start_moto()
        python = rayq.connect(account="bench", key=key)
        for n in counts:
            measured[n] = {
                "rayq": run_cycles(boto3_cycle(url, "bench", key, n), n, args.seconds),
                "moto": run_cycles(boto3_cycle(moto_url, "testing", "testing", n), n, args.seconds),
                "python": run_cycles(python_cycle(python), n, args.seconds)}
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        rayq.shutdown()
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    rows = [row for n in counts for row in _rows(n, measured[n])]
    report("http", rows, {"seconds": args.seconds, "threads": counts, "replicas": args.replicas,
                          "batch": BATCH, "body_bytes": len(BODY)})


def _rows(threads: int, m: dict) -> list[dict]:
    at = f"{threads} thread{'s' if threads > 1 else ''}"
    return [
        {"figure": f"rayq SQS endpoint, boto3, {at}", "value": m["rayq"][0], "unit": "msg/s",
         "baseline": "moto server mode, boto3", "baseline_value": m["moto"][0]},
        {"figure": f"rayq Python client, {at}", "value": m["python"][0], "unit": "msg/s",
         "baseline": "rayq SQS endpoint, boto3", "baseline_value": m["rayq"][0]},
        {"figure": f"rayq SQS endpoint cycle p50, {at}", "value": m["rayq"][1], "unit": "ms",
         "baseline": "moto server mode", "baseline_value": m["moto"][1]},
        {"figure": f"rayq Python client cycle p50, {at}", "value": m["python"][1], "unit": "ms",
         "baseline": "rayq SQS endpoint", "baseline_value": m["rayq"][1]},
    ]


if __name__ == "__main__":
    main()
