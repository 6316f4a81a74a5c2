"""The dependency rule of docs/design.md: rayq.core never reaches ray or the actors."""

import ast
import pathlib
import subprocess
import sys

import pytest

CORE = pathlib.Path(__file__).resolve().parents[2] / "rayq" / "core"


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: p.name)
def test_core_modules_import_neither_ray_nor_actors(path):
    assert not imported_modules(path) & {"ray", "actors"}


def test_the_core_package_is_not_empty():
    assert len(list(CORE.rglob("*.py"))) >= 8


def test_importing_the_core_loads_neither_ray_nor_actors():
    # Transitive: importing any rayq.core module runs rayq/__init__ first.
    modules = ", ".join("rayq." + ".".join(p.relative_to(CORE.parent).with_suffix("").parts)
                        for p in sorted(CORE.rglob("*.py")) if p.stem != "__init__")
    code = (f"import sys, {modules}, rayq.testing, rayq.config, rayq.errors; "
            "print(sorted(m for m in ('ray', 'actors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- actors/ holds no policy the engine should own ----------------------------------------
ACTORS = CORE.parents[1] / "actors"
ACTOR_FILES = sorted(ACTORS.glob("*.py"))
# Clock reads a component must take from its injected Clock (rayq.core.kit.clock) instead:
# the time module's clocks and datetime's "now". time.sleep and asyncio.sleep wait, they
# do not read the time; an asyncio loop's own loop.time() bounds waits on that loop's
# timers, which no injected clock drives.
CLOCK_READS = {("time", name) for name in ("time", "time_ns", "monotonic", "monotonic_ns",
                                           "perf_counter", "perf_counter_ns", "process_time")}
CLOCK_READS |= {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
                ("date", "today")}
# The most of all branch points that actors/ may hold (see branch_share); the rest is
# the engine's, under unit tests.
MAX_ACTOR_BRANCH_SHARE = 0.20


def branch_points(tree: ast.AST) -> int:
    """Decisions in a module: if/elif, for/while, except handlers, conditional
    expressions, each extra operand of and/or, and each condition of a comprehension."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler,
                             ast.IfExp)):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += len(node.ifs)
    return count


def package_branches(folder: pathlib.Path) -> int:
    return sum(branch_points(ast.parse(p.read_text())) for p in folder.rglob("*.py"))


def branch_share() -> tuple[int, int, float]:
    """(branch points in actors/, in rayq/core, the actors' share of both)."""
    actors, core = package_branches(ACTORS), package_branches(CORE)
    return actors, core, actors / (actors + core)


def test_the_actors_hold_less_than_a_fifth_of_the_decisions():
    actors, core, share = branch_share()
    assert share < MAX_ACTOR_BRANCH_SHARE, (
        f"actors/ holds {actors} of {actors + core} branch points ({share:.0%}): move "
        f"decisions into rayq/core as functions of state and now, with unit tests")


def test_branch_points_count_every_kind_of_decision():
    code = ("if a and b or c:\n  pass\nelif d:\n  pass\nfor x in y:\n  pass\nwhile z:\n  pass\n"
            "try:\n  pass\nexcept E:\n  pass\nexcept F:\n  pass\nv = 1 if w else 2\n"
            "u = [i for i in j if i if k]\n")
    # if, elif, one `and` + one `or`, for, while, 2 handlers, if-expression, 2 conditions
    assert branch_points(ast.parse(code)) == 11


def clock_reads(tree: ast.AST) -> list[str]:
    """Direct clock reads: ``time.time()``, ``datetime.now()`` and the like, or those
    functions imported by name (``from time import monotonic``)."""
    found = []
    for node in ast.walk(tree):
        owner = getattr(node, "value", None)  # `time` in time.time, `datetime` in x.datetime.now
        owner = getattr(owner, "id", None) or getattr(owner, "attr", None)
        if isinstance(node, ast.Attribute) and (owner, node.attr) in CLOCK_READS:
            found.append(f"line {node.lineno}: {owner}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            found += [f"line {node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if ("time", a.name) in CLOCK_READS]
    return found


@pytest.mark.parametrize("path", ACTOR_FILES, ids=lambda p: p.name)
def test_actors_read_the_time_only_through_the_clock_they_hold(path):
    assert clock_reads(ast.parse(path.read_text())) == []


def test_the_clock_rule_finds_direct_reads():
    code = ("import time, datetime\nfrom time import monotonic\nt = time.time()\n"
            "d = datetime.datetime.now()\ntime.sleep(1)\nn = self.clock.now()\n")
    assert clock_reads(ast.parse(code)) == [
        "line 2: from time import monotonic", "line 3: time.time", "line 4: datetime.now"]


def actor_calls_outside_the_helper(tree: ast.AST) -> list[int]:
    """Lines calling a method of an actor handle (``handle.method.remote(...)``) other
    than from a lambda handed to rayq.remote's helpers (which re-issue the call when the
    actor restarts, so the call must be re-makeable). ``ray.remote(...)`` and
    ``Class.options(...).remote(...)`` create actors and are not method calls."""
    inside = {id(n) for lam in ast.walk(tree) if isinstance(lam, ast.Lambda)
              for n in ast.walk(lam)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "remote" and isinstance(node.func.value, ast.Attribute)
            and id(node) not in inside]


@pytest.mark.parametrize("path", ACTOR_FILES, ids=lambda p: p.name)
def test_actors_call_each_other_through_the_one_retrying_helper(path):
    assert actor_calls_outside_the_helper(ast.parse(path.read_text())) == []
