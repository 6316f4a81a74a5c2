"""The dependency rules of docs/design.md: rayq.core never reaches ray or the actors; the
core's wings import each other in one order; no import cycle anywhere; actors/ never
imports the client layer above it."""

import ast
import itertools
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = ROOT / "rayq" / "core"


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
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


# -- the import graph of rayq/ and actors/ --------------------------------------------------
def project_modules() -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of rayq/ and actors/ (a package by its name)."""
    found = {}
    for top in ("rayq", "actors"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(modules: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from every import statement (inside
    functions and ``if TYPE_CHECKING:`` blocks too). ``from a import b`` names module
    ``a.b`` when there is one, else ``a``."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets |= {resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in modules
                            else resolve(base) for alias in node.names}
        graph[name] = targets - {None, name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    counter = itertools.count()

    def visit(node: str) -> None:
        index[node] = low[node] = next(counter)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


GRAPH = import_graph(project_modules())


def test_no_import_cycle_among_the_modules_of_rayq_and_actors():
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_imports_inside_type_checking_blocks():
    assert "rayq.core.kit.kv" in GRAPH["rayq.core.storage.ledger"]


# The wings of rayq/core and the wings each may import, in the order rayq/core/__init__.py
# gives. codec is the base; kit's history.py packs its records with codec.model, so kit
# sits on codec; storage holds no policy (the sender check and flooders' diverts come in
# from its caller); replication copies a store's write sets, whatever the store; the
# control plane keeps its own stores replicated; consumers run what control registered
# and end each delivery with a write of storage's.
WINGS = {
    "codec": set(),
    "kit": {"codec"},
    "auth": {"kit", "codec"},
    "storage": {"kit", "codec"},
    "replication": {"kit", "codec", "storage"},
    "fairness": {"kit", "codec"},
    "control": {"kit", "codec", "auth", "fairness", "storage", "replication"},
    "consumers": {"kit", "codec", "storage", "fairness", "control"},
    "flood": {"kit", "codec", "control"},
}
# Outside the wings, the core imports only these modules of rayq.
CORE_MAY_IMPORT = {"rayq.errors", "rayq.config"}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["rayq", "core"] else None


def wing_imports() -> dict[str, set[str]]:
    """Wing -> the other wings its modules import."""
    found: dict[str, set[str]] = {wing: set() for wing in WINGS}
    for module, targets in GRAPH.items():
        if wing_of(module):
            found[wing_of(module)] |= {wing_of(t) for t in targets if wing_of(t)} - {wing_of(module)}
    return found


def test_every_folder_of_the_core_is_a_known_wing():
    assert {p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(WINGS)


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_a_wing_imports_only_the_wings_below_it(wing):
    assert wing_imports()[wing] <= WINGS[wing], {
        module: sorted(t for t in GRAPH[module] if wing_of(t) and wing_of(t) != wing
                       and wing_of(t) not in WINGS[wing])
        for module in GRAPH if wing_of(module) == wing}


def test_the_core_imports_no_module_of_rayq_outside_it_but_errors_and_config():
    outside = {(module, target) for module, targets in GRAPH.items()
               if module.startswith("rayq.core") for target in targets
               if not target.startswith("rayq.core") and target not in CORE_MAY_IMPORT | {"rayq"}}
    assert outside == set()


# -- arrows run one way: core, then actors/, then the client layer ----------------------
def client_layer() -> set[str]:
    """The modules of rayq outside the core that import actors/, directly or through
    another module: the client, the CLI, the runtime's start and stop, the SQS service."""
    above = {m for m in GRAPH if m.startswith("actors")}
    layer: set[str] = set()
    while True:
        more = {m for m, targets in GRAPH.items() if m.startswith("rayq") and m not in layer
                and targets & (above | layer)}
        if not more:
            return layer
        layer |= more


def test_no_actor_imports_the_client_layer():
    layer = client_layer()
    upward = {(m, t) for m, targets in GRAPH.items() if m.startswith("actors")
              for t in targets if t in layer}
    assert upward == set()


def test_the_client_layer_holds_the_client_and_the_sqs_service_but_not_the_helpers():
    layer = client_layer()
    assert {"rayq.client", "rayq.cli", "rayq.sqs.service"} <= layer
    assert not {"rayq.remote", "rayq.channel", "rayq.names", "rayq.config"} & layer


def test_the_core_imports_no_module_of_the_client_layer_or_actors():
    assert {(m, t) for m, targets in GRAPH.items() if m.startswith("rayq.core")
            for t in targets if t in client_layer() or t.startswith("actors")} == set()


# -- actors/ holds no policy the engine should own ----------------------------------------
ACTORS = ROOT / "actors"
ACTOR_FILES = sorted(ACTORS.rglob("*.py"))
# Clock reads a component must take from its injected Clock (rayq.core.kit.clock) instead:
# the time module's clocks and datetime's "now". time.sleep and asyncio.sleep wait, they
# do not read the time; an asyncio loop's own loop.time() bounds waits on that loop's
# timers, which no injected clock drives.
CLOCK_READS = {("time", name) for name in ("time", "time_ns", "monotonic", "monotonic_ns",
                                           "perf_counter", "perf_counter_ns", "process_time")}
CLOCK_READS |= {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
                ("date", "today")}
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


@pytest.mark.parametrize("path", ACTOR_FILES, ids=lambda p: str(p.relative_to(ROOT)))
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


@pytest.mark.parametrize("path", ACTOR_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_actors_call_each_other_through_the_one_retrying_helper(path):
    assert actor_calls_outside_the_helper(ast.parse(path.read_text())) == []
