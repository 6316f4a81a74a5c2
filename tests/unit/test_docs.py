"""Comments and docstrings cite design pages that exist: every ``docs/<page>.md`` a
source file names is in the repository, and nothing points at documents that are not
(the design page outside ``docs/``, numbered source texts, section signs)."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("rayq", "actors", "benchmarks", "tests")
DOCS_PATH = re.compile(r"docs/([\w.-]+\.md)")
# A numbered source text ("seed 003"), a section sign ("design §9"), or the design page
# named without its docs/ path.
UNRESOLVED = re.compile(r"\bseed 0\d\d|\bdesign\s*§|(?<!docs/)\bdesign\.md", re.IGNORECASE)


def unresolved_citations(text: str, docs_dir: Path) -> list[str]:
    """What ``text`` cites that is not a page of ``docs_dir``, one entry a finding."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for page in DOCS_PATH.findall(line):
            if not (docs_dir / page).is_file():
                found.append(f"{number}: docs/{page} does not exist")
        for match in UNRESOLVED.finditer(line):
            found.append(f"{number}: {match.group(0)!r} names no docs/ page")
    return found


def source_files() -> list[Path]:
    """Every Python file, but this one: it spells the patterns out to test the checker."""
    this = Path(__file__).resolve()
    return sorted(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*.py") if p.resolve() != this)


def test_the_checker_flags_missing_pages_and_unresolved_citations(tmp_path):
    (tmp_path / "here.md").write_text("# here\n")
    text = ("ok: docs/here.md\n"
            "missing: docs/gone.md\n"
            "numbered: (seed 003)\n"
            "section: design §9\n"
            "bare: see design.md\n"
            "fine: see docs/here.md, not docs/design.md's absence\n")
    assert unresolved_citations(text, tmp_path) == [
        "2: docs/gone.md does not exist",
        "3: 'seed 003' names no docs/ page",
        "4: 'design §' names no docs/ page",
        "5: 'design.md' names no docs/ page",
        "6: docs/design.md does not exist",
    ]


@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_design_citation_in_the_code_points_at_a_page_that_exists(path):
    assert unresolved_citations(path.read_text(), REPO / "docs") == []


def test_every_link_between_docs_pages_resolves():
    for page in (REPO / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([\w.-]+\.md)\)", page.read_text()):
            assert (REPO / "docs" / target).is_file(), f"{page.name} links to {target}"


def test_every_mechanism_page_names_its_source_text():
    pages = [p for p in (REPO / "docs").glob("*.md") if p.name != "design.md"]
    assert len(pages) >= 11
    for page in pages:
        assert "**Source text" in page.read_text(), page.name
        assert f"]({page.name})" in (REPO / "docs" / "design.md").read_text(), page.name
