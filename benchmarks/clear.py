"""What clearing a deep subqueue costs the caller and the shard: the old synchronous
clear (one transaction over every row) against the background removal (mark, then
bounded transactions), on two copies of the same store in the same run.

    python benchmarks/clear.py [--messages 50000] [--rows-per-step 2000]

The figure that matters for other queues on the shard is the longest single
transaction: every call on the shard waits behind it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import Timer, report  # noqa: E402

from rayq.config import StoreConfig  # noqa: E402
from rayq.core.codec.model import NewMessage, encode_body  # noqa: E402
from rayq.core.codec.wire import encode_messages  # noqa: E402
from rayq.core.storage.store import open_store  # noqa: E402
from rayq.core.storage.writes import Put  # noqa: E402


def filled(path: str, messages: int):
    store = open_store(path, config=StoreConfig(cache_budget_bytes=0))
    body = encode_body(b"x" * 200, 1 << 20)
    for start in range(0, messages, 1000):
        store.run(Put(1, encode_messages([NewMessage(body, "acme", "report", "report")
                                          for _ in range(min(1000, messages - start))])))
    return store


def background(store, rows_per_step: int) -> tuple[float, float, float, int]:
    """(seconds the caller waits, longest step, all steps, steps)."""
    with Timer() as mark:
        store.purge([1])
    longest = total = 0.0
    steps = 0
    while store.purging:
        with Timer() as step:
            store.purge_some(rows_per_step)
        longest, total, steps = max(longest, step.seconds), total + step.seconds, steps + 1
    return mark.seconds, longest, total, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rows-per-step", type=int, default=2_000)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="rayq-clear-")
    try:
        old = filled(os.path.join(root, "sync"), args.messages)
        with Timer() as sync:
            old.clear(1)
        old.close()
        new = filled(os.path.join(root, "background"), args.messages)
        mark_s, longest_s, total_s, steps = background(new, args.rows_per_step)
        assert new.stats().messages == 0
        new.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ms = 1000.0
    report("clear", [
        {"figure": "clear(): the caller waits", "value": mark_s * ms, "unit": "ms",
         "baseline": "synchronous clear, one transaction", "baseline_value": sync.seconds * ms},
        {"figure": "longest transaction on the shard", "value": longest_s * ms, "unit": "ms",
         "baseline": "synchronous clear, one transaction", "baseline_value": sync.seconds * ms},
        {"figure": "all background steps", "value": total_s * ms, "unit": "ms",
         "baseline": "synchronous clear, one transaction", "baseline_value": sync.seconds * ms},
    ], {"messages": args.messages, "rows_per_step": args.rows_per_step, "steps": steps})


if __name__ == "__main__":
    main()
