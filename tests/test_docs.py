"""The documentation's shape: a README a newcomer reads in minutes, reference pages of one screenful or so,
evidence pages made of generated tables only, and no commit named in running text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = re.compile(r"<!-- results: [a-z0-9._-]+ -->\n.*?<!-- /results -->|<!-- ([a-z-]+):start -->.*?"
                       r"<!-- \1:end -->", re.S)  # bench/render_docs.py's blocks; step_times.py render's markers
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
LEAD_REWORKS: set[str] = set()
REFERENCE = sorted(page for page in DOCS.glob("*.md") if page.name not in LEAD_REWORKS)


def running_text(page: Path) -> str:
    return GENERATED.sub("", page.read_text())


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", REFERENCE, ids=lambda page: page.name)
def test_a_reference_page_is_at_most_150_lines(page):
    assert len(page.read_text().splitlines()) <= 150


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *REFERENCE,
                                  *sorted((DOCS / "history").glob("*.md")), *sorted((DOCS / "evidence").glob("*.md"))],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_no_commit_is_named_in_running_text(page):
    assert COMMIT.findall(running_text(page)) == []


@pytest.mark.parametrize("page", sorted((DOCS / "evidence").glob("*.md")), ids=lambda page: page.name)
def test_an_evidence_page_holds_generated_tables_and_their_headings_only(page):
    text = running_text(page)
    assert "|" not in text  # every table is inside a generated block
    body = text.split("\n## ", 1)[1]  # after the page's one-paragraph introduction
    leftover = [line for line in body.splitlines() if line.strip() and not line.startswith("## ")
                and not body.startswith(line)]
    assert leftover == []


def test_the_commit_pattern_finds_a_hash_and_nothing_else():
    assert COMMIT.findall("run from d3e977e, then 2e-3 at 1000 steps, 0.8515") == ["d3e977e"]


def test_the_families_table_is_what_the_declarations_say():
    import subprocess
    import sys

    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "families_table.py"), "--check"], cwd=ROOT,
                           capture_output=True, text=True)
    assert check.returncode == 0, "docs/families.md is out of date: python scripts/families_table.py"
