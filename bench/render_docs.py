"""Render the docs' benchmark tables from the files under benchmarks/results/ (bench/results.py writes them).

    python bench/render_docs.py [--check]

In README.md and docs/*.md, everything between `<!-- results: NAME -->` and `<!-- /results -->` is replaced by
the table of the newest `benchmarks/results/NAME-<date>.json`, and one line saying where, when and how it was
measured. A marker whose benchmark has no file yet says so. --check changes nothing and exits 1 when a page is
out of date (for CI).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- results: ([a-z0-9._-]+) -->\n)(.*?)(<!-- /results -->)", re.S)


def newest(name: str, folder: Path = RESULTS) -> dict | None:
    """The newest results file of benchmark `name` (by the date in its file name), or None."""
    files = sorted(folder.glob(f"{name}-[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9].json"))
    return json.loads(files[-1].read_text()) if files else None


def cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(cell, value))
    return "–" if value is None else str(value).replace("|", "\\|")


def table(record: dict, commit: bool = True) -> str:
    """The Markdown table of one results record, with its provenance line (the commit left out for the README,
    which names none)."""
    columns = record["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in record["rows"]]
    hardware = record["hardware"]
    where = hardware.get("gpu") or f"{hardware['cpu']['model']} ({hardware['cpu']['cores']} cores, " \
                                   f"{' '.join(hardware['cpu']['flags']) or 'no AVX2'})"
    precision = f" · {record['precision']}" if record.get("precision") else ""
    made = f" · commit {record['commit']}" if commit else ""
    lines += ["", f"*{where} · torch {record['torch']}{precision} · {record['date'][:10]}{made} · "
                  f"`{record['command']}`*"]
    if record.get("notes"):
        lines += ["", record["notes"]]
    return "\n".join(lines) + "\n"


def render(text: str, folder: Path = RESULTS, commit: bool = True) -> str:
    """`text` with every results block filled from `folder`."""
    def fill(match: re.Match) -> str:
        record = newest(match.group(2), folder)
        body = table(record, commit) if record else f"*No results yet: run the benchmark that writes `{match.group(2)}`.*\n"
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(fill, text)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        new = render(text, commit=page.name != "README.md")
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    for page in stale:
        print(f"{'out of date' if args.check else 'rendered'}: {page.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
