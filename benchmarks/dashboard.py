"""What the Ray dashboard costs the embedded default: start-up time and memory of
``rayq.start()`` with the dashboard (the default) and without (RAYQ_DASHBOARD=0),
each in a fresh process (tests/integration/scripts/embedded.py), alternating.

    python benchmarks/dashboard.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _report import report

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "tests", "integration", "scripts",
                      "embedded.py")
# Processes that run only with the dashboard: its head, its module workers and their
# multiprocessing helpers (the dashboard agent runs either way).
DASHBOARD_MARKS = ("dashboard/dashboard.py", "ray-dashboard-", "multiprocessing.forkserver",
                   "multiprocessing.resource_tracker")


def run(dashboard: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with tempfile.TemporaryDirectory() as data_dir:
        flags = [] if dashboard else ["--no-dashboard"]
        out = subprocess.run([sys.executable, SCRIPT, data_dir, *flags], env=env, check=True,
                             capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def memory(result: dict, key: str, only_dashboard: bool = False) -> float:
    procs = [p for p in result["processes"]
             if not only_dashboard or any(m in p["name"] for m in DASHBOARD_MARKS)]
    return sum(p[key] for p in procs) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    runs = {True: [], False: []}
    for _ in range(rounds):
        for dashboard in (True, False):
            runs[dashboard].append(run(dashboard))
    on, off = runs[True], runs[False]
    med = statistics.median
    rows = [
        {"figure": "start-up s, dashboard on", "value": med(r["startup_s"] for r in on),
         "unit": "s", "baseline": "dashboard off", "baseline_value": med(r["startup_s"] for r in off)},
        {"figure": "session PSS, dashboard on", "value": med(memory(r, "pss_bytes") for r in on),
         "unit": "MiB", "baseline": "dashboard off",
         "baseline_value": med(memory(r, "pss_bytes") for r in off)},
        {"figure": "dashboard processes PSS", "value": med(memory(r, "pss_bytes", True) for r in on),
         "unit": "MiB", "baseline": "whole session, dashboard on",
         "baseline_value": med(memory(r, "pss_bytes") for r in on)},
        {"figure": "dashboard processes RSS", "value": med(memory(r, "rss_bytes", True) for r in on),
         "unit": "MiB", "baseline": "whole session RSS, dashboard on",
         "baseline_value": med(memory(r, "rss_bytes") for r in on)},
    ]
    report("dashboard", rows, {"rounds": rounds})


if __name__ == "__main__":
    main()
