"""docs/architecture.md is the map of the code: every module path it names exists, and it
names every module of rayq/ and actors/ (a package by its folder, ``rayq/sqs/``, or by
its ``__init__.py``)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"

# A path of rayq/ or actors/ to a module (``rayq/core/kit/clock.py``) or a package
# (``rayq/core/kit/``), not part of a longer word or path.
PATH = re.compile(r"(?<![\w./<>-])((?:rayq|actors)/(?:\w+/)*(?:\w+\.py)?)(?!\w)")


def named_paths(text: str) -> set[str]:
    return {found.group(1) for found in PATH.finditer(text)}


def module_files(path: str) -> str:
    """The file a named path stands for: a package stands for its ``__init__.py``."""
    return path + "__init__.py" if path.endswith("/") else path


def project_modules() -> set[str]:
    return {str(path.relative_to(ROOT)) for top in ("rayq", "actors")
            for path in (ROOT / top).rglob("*.py")}


def test_every_module_path_the_map_names_exists():
    named = {module_files(path) for path in named_paths(MAP.read_text())}
    assert sorted(path for path in named if not (ROOT / path).is_file()) == []


def test_the_map_names_every_module_of_rayq_and_actors():
    named = {module_files(path) for path in named_paths(MAP.read_text())}
    assert sorted(project_modules() - named) == []


def test_paths_are_found_as_modules_and_packages_and_not_inside_other_words():
    text = ("`rayq/core/kit/clock.py`, rayq/sqs/ and actors/shard.py. Not `rayq/core` nor "
            "`<data_dir>/rayq/x.py` nor myrayq/a.py")
    assert named_paths(text) == {"rayq/core/kit/clock.py", "rayq/sqs/", "actors/shard.py"}
