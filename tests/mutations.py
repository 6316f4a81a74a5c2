"""Mutation check: each mutant must make the tests chosen for it fail.

Run from the repository root:

    python tests/mutations.py              # every mutation
    python tests/mutations.py -k balancer  # those whose name contains "balancer"
    python tests/mutations.py --check      # only check that every pin still holds

Each mutant is pinned to a function: a module, the function's qualified name inside
it (``Class.method``, found with ``ast``), and a text that must occur exactly once
within that function's source. Code that moves within or between files is followed by
editing the module or name; a pin whose function is gone, or whose text is gone or
repeated inside it, is an error, never a silent skip.

Each mutation is applied to a fresh copy of the git-tracked tree in a temporary
directory (the checkout is never touched), then pytest runs there on the mutant's
tests (the contract and unit suites unless the row names others, such as one
integration test). A mutant is *caught* when that run fails. First each selection of
tests must pass on the unmutated copy, so a failure that has nothing to do with the
mutation cannot count as a catch. The script exits 1 if a selection fails unmutated,
if any mutant survives, or if a pin no longer holds.
"""

from __future__ import annotations

import argparse
import ast
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
    """``old`` (exactly once inside ``function`` of ``module``) becomes ``new``; ``tests``
    is the pytest selection that must then fail."""

    name: str
    module: str    # dotted: rayq.core.storage.waiters
    function: str  # qualified inside the module: OutcomeWaiters._forget
    old: str
    new: str
    tests: tuple[str, ...] = SUITES


SQS_SETTINGS = "tests/integration/test_sqs_settings.py"
REPORT_CELLS = "tests/unit/test_report_cells.py"
CONTROL_TESTS = ("tests/unit/test_control_store.py",
                 "tests/unit/test_simulation.py::test_named_seeds")

MUTATIONS = (
    # -- storage (rayq/core/storage): pins to re-point when storage code moves
    Mutation("ordered key not held while in flight", "rayq.core.storage.picking",
             "_KeyRows.__init__", "locked_until(w.txn, sq, kid, now_us) is not None",
             "locked_until(w.txn, sq, kid, now_us) is None and False"),
    Mutation("ordered row loses its place when received", "rayq.core.storage.ledger",
             "Ledger.take_rows", "            if sq in ordered:", "            if False:"),
    Mutation("dequeue count not incremented", "rayq.core.storage.ledger", "Ledger.take_rows",
             "redelivered(value, meta.dequeue_count + 1, nonce,",
             "redelivered(value, meta.dequeue_count, nonce,"),
    Mutation("first receive time overwritten by later receives", "rayq.core.storage.layout",
             "first_received", "meta.first_received_us or now_us", "now_us"),
    Mutation("receipt nonce not compared on delete", "rayq.core.storage.ledger",
             "Ledger.resolve",
             "layout.nonce_of(value) != nonce or ", ""),
    Mutation("visibility timeout ignored", "rayq.core.storage.messages", "receive",
             "_deliver(w, env, found, to_us(visibility_timeout_s))", "_deliver(w, env, found, 0)"),
    Mutation("a leaving waiter takes the others' wake-ups", "rayq.core.storage.waiters",
             "OutcomeWaiters._forget", "w[1] is not future", "w[1] is future"),
    Mutation("noisy keys served first", "rayq.core.storage.dispatch", "FairDispatch.score",
             "(state.noisy_since is not None,", "(state.noisy_since is None,"),
    Mutation("purge removes other queues' spilled messages", "rayq.core.storage.purge",
             "remove_spilled", "spill_source(value) in sources", "spill_source(value) not in sources"),
    Mutation("a put record wakes no parked poll", "rayq.core.storage.writes", "Put.wakes",
             "((self.subqueue, len(ids)),)", "()"),
    Mutation("a large put record counted small", "rayq.core.storage.writes", "Put.small",
             "len(self.batch) <= SMALL_PUT_BYTES", "len(self.batch) >= 0"),
    Mutation("an end batch decodes records of any write", "rayq.core.storage.writes",
             "_decode_end", "call[0] in ENDS", "call[0] in ENDS or call[0] == 'put'"),
    Mutation("follower copy opened without fsync", "rayq.core.replication.replica", "open_copy",
             "LmdbKV(path, map_size=map_bytes)", "LmdbKV(path, map_size=map_bytes, durable=False)"),
    # -- the rest of the core
    Mutation("usage-victim comparison flipped", "rayq.core.fairness.policy", "evaluate",
             "if s > config.band", "if s < config.band"),
    Mutation("balancer moves load the wrong way", "rayq.core.consumers.balancer", "next_load",
             "        return min(load + 1, config.max_load)\n    if hit_rate < target:\n"
             "        return max(load - 1, config.min_load)",
             "        return max(load - 1, config.min_load)\n    if hit_rate < target:\n"
             "        return min(load + 1, config.max_load)"),
    Mutation("flood enqueue threshold dropped", "rayq.core.flood.detection", "tenant_flooders",
             "if combo[:2] in flooding and n > config.enqueue_threshold}",
             "if combo[:2] in flooding}"),
    Mutation("put_target chooses the fullest subqueue", "rayq.core.control.registry",
             "put_target", "return min(open_,", "return max(open_,"),
    Mutation("scaling never adds a subqueue", "rayq.core.control.scaling", "decide",
             "if busy and live < config.max_subqueues:", "if False:"),
    Mutation("linger not capped at max_s", "rayq.core.kit.batcher", "Batcher.linger",
             "min(max_s,", "max(max_s,"),
    Mutation("lease limit off by one", "rayq.core.fairness.leases", "ConcurrencyLeases.acquire",
             "len(held) >= limit", "len(held) > limit"),
    Mutation("a lease lives past its expiry", "rayq.core.fairness.leases",
             "ConcurrencyLeases._live", "expires <= now", "expires < now"),
    Mutation("nonces forgotten inside their window", "rayq.core.auth.nonces", "remember",
             "now - window_s", "now"),
    Mutation("a fetch begun before forget is trusted", "rayq.core.kit.renewed",
             "Refreshed.fresh", "if forgets == self._forgets:", "if True:"),
    Mutation("a client's extension type unpickled", "rayq.core.codec.frames", "decode_request",
             "ext_hook=_refuse_ext", "ext_hook=_ext"),
    Mutation("route affinity kept to a subqueue that takes no puts",
             "rayq.core.control.routes", "RouteCache.put",
             "mine.state is SubqueueState.ALL", "mine.state is not SubqueueState.ALL"),
    Mutation("seeded follower in sync before it holds every acknowledged write set",
             "rayq.core.replication.shipping", "Shipper._send",
             "self._counted_at[node] = self.log.committed", "self._counted_at[node] = applied"),
    Mutation("failover fences the followers with the current epoch",
             "rayq.core.replication.shard_places", "fail_over", "place.epoch + 1", "place.epoch"),
    Mutation("a control copy that applied nothing promoted", "rayq.core.control.control_places",
             "promoted", "if applied.get(n, 0) > 0]", "if n in applied]", tests=CONTROL_TESTS),
    Mutation("a control leader refuses for good once a copy was fenced",
             "rayq.core.control.control_store", "ControlReplication._failed",
             "        log.warning(", "        if isinstance(err, StaleEpoch):\n"
             "            self._refuse(err)\n        log.warning(", tests=CONTROL_TESTS),
    Mutation("a control copy seeded again on the node that just failed",
             "rayq.core.control.control_places", "seed_target",
             "(failed.get(n, 0), copies_per_node", "(0, copies_per_node", tests=CONTROL_TESTS),
    Mutation("SigV4 query string left unsorted", "rayq.sqs.sigv4", "_canonical_query",
             "pairs = sorted(", "pairs = list("),
    Mutation("SQS attribute upper bound unchecked", "rayq.sqs.attributes", "_int_in",
             "not low <= int(value) <= high", "not low <= int(value)"),
    Mutation("queue VisibilityTimeout ignored on receive", "rayq.sqs.api",
             "SqsApi._receive_message", "settings.visibility_timeout_s", "30",
             tests=(f"{SQS_SETTINGS}::test_a_queue_with_visibility_timeout_0_delivers_again_at_once",)),
    Mutation("queue ReceiveMessageWaitTimeSeconds ignored on receive", "rayq.sqs.api",
             "SqsApi._receive_message", "settings.wait_s", "0",
             tests=(f"{SQS_SETTINGS}::test_a_queue_with_a_wait_time_long_polls_by_default",)),
    # -- the report's aggregates (rayq/analytics/cells.py)
    Mutation("merged cells keep one sketch of a key, not all", "rayq.analytics.cells", "_merged",
             "merged.merge(kll_doubles_sketch.deserialize(data))",
             "merged.merge(kll_doubles_sketch.deserialize(data)); break",
             tests=(REPORT_CELLS,)),
    Mutation("a task's wait ends at its completion, not its start", "rayq.analytics.cells",
             "_waiting", "pc.subtract(seconds, pc.fill_null(done[\"usage_s\"], 0.0))",
             "seconds", tests=(REPORT_CELLS,)),
)


def function_span(source: str, qualname: str) -> tuple[int, int]:
    """(start, end) character offsets of the function ``qualname`` in ``source``
    (from its ``def`` line to its last line). Raises LookupError when there is none."""
    found: list[ast.AST] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if name == qualname and not isinstance(child, ast.ClassDef):
                    found.append(child)
                walk(child, name + ".")

    walk(ast.parse(source), "")
    if len(found) != 1:
        raise LookupError(f"function {qualname} found {len(found)} times")
    node = found[0]
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts[node.lineno - 1], starts[node.end_lineno]


def module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def pinned(mutation: Mutation, tree: Path) -> tuple[Path, str, int, int]:
    """The mutant's file, its text, and the span of its function; LookupError (naming the
    mutant) when the module, the function, or a single occurrence of the text is gone."""
    target = tree / module_path(mutation.module)
    where = f"{mutation.name}: {mutation.module}.{mutation.function}"
    if not target.is_file():
        raise LookupError(f"{where}: no module {module_path(mutation.module)}")
    text = target.read_text()
    try:
        start, end = function_span(text, mutation.function)
    except LookupError as err:
        raise LookupError(f"{where}: {err}") from None
    count = text[start:end].count(mutation.old)
    if count != 1:
        raise LookupError(f"{where}: expected {mutation.old!r} once in the function, found "
                          f"{count} times; update tests/mutations.py")
    return target, text, start, end


def mutate(mutation: Mutation, tree: Path) -> None:
    target, text, start, end = pinned(mutation, tree)
    body = text[start:end].replace(mutation.old, mutation.new)
    target.write_text(text[:start] + body + text[end:])


def copy_tree(into: Path) -> None:
    """Copy the git-tracked files (with uncommitted edits) into ``into``."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                             capture_output=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)


def tests_fail(tree: Path, tests: tuple[str, ...]) -> tuple[bool, str]:
    """Run pytest on ``tests`` in ``tree``: (failed, the failing test or the summary)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *tests], cwd=tree, env=env, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    failed = [line.removeprefix("FAILED ") for line in lines if line.startswith("FAILED ")]
    summary = failed[0] if failed else lines[-1] if lines else run.stderr.strip()[-200:]
    return run.returncode != 0, summary


def unmutated_pass(selections: list[tuple[str, ...]]) -> bool:
    """Whether every selection of tests passes on an unmutated copy."""
    ok = True
    with tempfile.TemporaryDirectory(prefix="rayq-mutant-") as tmp:
        copy_tree(Path(tmp))
        for tests in selections:
            failed, summary = tests_fail(Path(tmp), tests)
            label = "(no mutation)" if tests == SUITES else f"(no mutation) {' '.join(tests)}"
            print(f"{'BROKEN' if failed else 'ok':9} {label:50} {summary}")
            ok = ok and not failed
    return ok


def check_pins(chosen: list[Mutation]) -> list[str]:
    """The errors of the pins of ``chosen`` against the checkout (none: all hold)."""
    errors = []
    for mutation in chosen:
        try:
            pinned(mutation, ROOT)
        except LookupError as err:
            errors.append(str(err))
    return errors


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # a line per mutant as it ends, also into a file
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this")
    parser.add_argument("--check", action="store_true",
                        help="only check that every pin holds; run no tests")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if args.k in m.name]
    errors = check_pins(chosen)
    for error in errors:
        print(f"MISSING   {error}")
    if errors or args.check:
        print(f"{len(chosen) - len(errors)} of {len(chosen)} pins hold")
        return 1 if errors else 0
    if not unmutated_pass(list(dict.fromkeys(m.tests for m in chosen))):
        print("the tests fail without any mutation: fix that first")
        return 1
    survivors = []
    for mutation in chosen:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="rayq-mutant-") as tmp:
            copy_tree(Path(tmp))
            mutate(mutation, Path(tmp))
            caught, summary = tests_fail(Path(tmp), mutation.tests)
        verdict = "caught" if caught else "SURVIVED"
        print(f"{verdict:9} {mutation.name:50} {time.monotonic() - started:5.1f} s  {summary}")
        if not caught:
            survivors.append(mutation.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants caught")
    for name in survivors:
        print(f"SURVIVED: {name}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
