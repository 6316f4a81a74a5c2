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


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_modules_import_neither_ray_nor_actors(path):
    assert not imported_modules(path) & {"ray", "actors"}


def test_the_core_package_is_not_empty():
    assert len(list(CORE.glob("*.py"))) >= 8


def test_importing_the_core_loads_neither_ray_nor_actors():
    # Transitive: importing any rayq.core module runs rayq/__init__ first.
    modules = ", ".join(f"rayq.core.{p.stem}" for p in sorted(CORE.glob("*.py")) if p.stem != "__init__")
    code = (f"import sys, {modules}, rayq.testing, rayq.config, rayq.errors; "
            "print(sorted(m for m in ('ray', 'actors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
