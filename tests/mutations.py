"""Mutation check of the pure core: each mutant must make the unit or contract suite fail.

Run from the repository root:

    python tests/mutations.py            # every mutation
    python tests/mutations.py -k balancer  # those whose name contains "balancer"

Each mutation is applied to a fresh copy of the git-tracked tree in a temporary
directory (the checkout is never touched), then ``pytest tests/unit tests/contract -x``
runs there (contract first). A mutant is *caught* when that run fails. First the unmutated copy must
pass, so a failure that has nothing to do with the mutation cannot count as a catch.
The script exits 1 if the copy fails unmutated, if any mutant survives, or if a
mutation's source text is no longer found (edit the table when code moves).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITES = ("tests/contract", "tests/unit")  # contract first: it is quicker to fail


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str  # must occur exactly once in path
    new: str


MUTATIONS = (
    Mutation("dequeue count not incremented", "rayq/core/storage/ledger.py",
             "new_value = rows.redelivered(value, meta.dequeue_count + 1, nonce)",
             "new_value = rows.redelivered(value, meta.dequeue_count, nonce)"),
    Mutation("receipt nonce not compared on delete", "rayq/core/storage/ledger.py",
             "if value is None or rows.nonce_of(value) != nonce or nonce == rows.NO_NONCE:",
             "if value is None or nonce == rows.NO_NONCE:"),
    Mutation("visibility timeout ignored", "rayq/core/storage/messages.py",
             "delivered = _deliver(w, env, found, to_us(visibility_timeout_s))",
             "delivered = _deliver(w, env, found, 0)"),
    Mutation("usage-victim comparison flipped", "rayq/core/fairness/policy.py",
             "usage_victims = frozenset(k for k, s in starvation.items() if s > config.band)",
             "usage_victims = frozenset(k for k, s in starvation.items() if s < config.band)"),
    Mutation("balancer moves load the wrong way", "rayq/core/control/balancer.py",
             "        return min(load + 1, config.max_load)\n    if hit_rate < target:\n"
             "        return max(load - 1, config.min_load)",
             "        return max(load - 1, config.min_load)\n    if hit_rate < target:\n"
             "        return min(load + 1, config.max_load)"),
    Mutation("flood enqueue threshold dropped", "rayq/core/flood/detection.py",
             "if combo[:2] in flooding and n > config.enqueue_threshold}",
             "if combo[:2] in flooding}"),
    Mutation("put_target chooses the fullest subqueue", "rayq/core/control/registry.py",
             "return min(open_, key=lambda s: (counts.get(s.id, 0), s.version))",
             "return max(open_, key=lambda s: (counts.get(s.id, 0), s.version))"),
    Mutation("scaling never adds a subqueue", "rayq/core/control/scaling.py",
             "if busy and live < config.max_subqueues:", "if False:"),
)


def copy_tree(into: Path) -> None:
    """Copy the git-tracked files (with uncommitted edits) into ``into``."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)


def mutate(mutation: Mutation, tree: Path) -> None:
    target = tree / mutation.path
    text = target.read_text()
    if text.count(mutation.old) != 1:
        raise LookupError(f"{mutation.name}: expected the text once in {mutation.path}, found "
                          f"{text.count(mutation.old)} times; update tests/mutations.py")
    target.write_text(text.replace(mutation.old, mutation.new))


def suites_fail(tree: Path) -> tuple[bool, str]:
    """Run the unit and contract suites in ``tree``: (failed, the failing test or summary)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *SUITES], cwd=tree, env=env, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    failed = [line.removeprefix("FAILED ") for line in lines if line.startswith("FAILED ")]
    summary = failed[0] if failed else lines[-1] if lines else run.stderr.strip()[-200:]
    return run.returncode != 0, summary


def unmutated_passes() -> bool:
    with tempfile.TemporaryDirectory(prefix="rayq-mutant-") as tmp:
        copy_tree(Path(tmp))
        failed, summary = suites_fail(Path(tmp))
    print(f"{'BROKEN' if failed else 'ok':9} {'(no mutation)':42} {summary}")
    return not failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    chosen = [m for m in MUTATIONS if parser.parse_args().k in m.name]
    if not unmutated_passes():
        print("the suites fail without any mutation: fix that first")
        return 1
    survivors = []
    for mutation in chosen:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="rayq-mutant-") as tmp:
            copy_tree(Path(tmp))
            try:
                mutate(mutation, Path(tmp))
            except LookupError as err:
                print(f"MISSING   {err}")
                survivors.append(mutation.name)
                continue
            caught, summary = suites_fail(Path(tmp))
        verdict = "caught" if caught else "SURVIVED"
        print(f"{verdict:9} {mutation.name:42} {time.monotonic() - started:5.1f} s  {summary}")
        if not caught:
            survivors.append(mutation.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants caught")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
