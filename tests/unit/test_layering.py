"""The dependency rule of the design: rayq.core never reaches ray or the actors."""

import ast
import pathlib

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
