"""Render the docs' benchmark tables from the results files (bench/results.py writes them).

    python bench/render_docs.py [--check]

In README.md and every page under docs/, everything between `<!-- results: NAME -->` and `<!-- /results -->` is
replaced by the table of the newest `NAME-<date>.json` under benchmarks/results/ or an experiment's folder
(lab/experiments/<topic>/), and one line saying where, when and how it was measured. A number in a sentence is
rendered the same way: `<!-- value: NAME:PATH -->…<!-- /value -->` (see `value`). A marker whose benchmark has no
file, or whose path names nothing in it, is an error (exit 2, the page left as it was): a page shows no empty
results block and no number its file does not hold. --check changes nothing and exits 1 when a page is out of date
(for CI).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXPERIMENTS = ROOT / "lab" / "experiments"
BLOCK = re.compile(r"(<!-- results: ([a-z0-9._-]+) -->\n)(.*?)(<!-- /results -->)", re.S)
VALUE = re.compile(r"(<!-- value: ([a-z0-9._-]+(?:@[0-9]{4}-[0-9]{2}-[0-9]{2})?:[^\n]*?) -->)"
                   r"([^\n]*?)(<!-- /value -->)")
VALUE_START = re.compile(r"<!-- value: [a-z0-9._-]+(?:@[0-9-]+)?:")


def newest(name: str, *folders: Path) -> dict | None:
    """The newest results file of benchmark `name` (by the date in its file name) in `folders` (default:
    benchmarks/results/ and every lab/experiments/<topic>/), or None."""
    folders = folders or (RESULTS, *sorted(EXPERIMENTS.glob("*/")))
    pattern = f"{name}-[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9].json"
    files = sorted((path for folder in folders for path in folder.glob(pattern)), key=lambda path: path.name)
    return json.loads(files[-1].read_text()) if files else None


class MissingResults(ValueError):
    """A page marks a results block or value whose benchmark has no results file, or a path its file lacks."""


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


def lookup(record, path: str):
    """The item of `record` that `path` names: `/`-separated steps, each a dict key, a list index, or
    `COLUMN=VALUE` for the one row of a list whose COLUMN reads VALUE (`rows/budget=8/answer`; several joined by
    `&`: `rows/task=mrpc&member=mean/absolute_off`).

    Raises:
        MissingResults: a step names nothing, or more than one row.
    """
    item = record
    for step in path.split("/"):
        if isinstance(item, list) and "=" in step:
            wanted = [condition.split("=", 1) for condition in step.split("&")]
            found = [row for row in item
                     if isinstance(row, dict) and all(cell(row.get(key)) == value for key, value in wanted)]
            if len(found) != 1:
                raise MissingResults(f"{len(found)} rows have {step} (`{path}`)")
            item = found[0]
        elif isinstance(item, list) and step.isdigit() and int(step) < len(item):
            item = item[int(step)]
        elif isinstance(item, dict) and step in item:
            item = item[step]
        else:
            raise MissingResults(f"nothing at `{step}` of `{path}`")
    return item


def dated(name: str, day: str, *folders: Path) -> dict | None:
    """The results file `NAME-<day>.json` itself (default folders: as `newest`), or None."""
    folders = folders or (RESULTS, *sorted(EXPERIMENTS.glob("*/")))
    files = [folder / f"{name}-{day}.json" for folder in folders if (folder / f"{name}-{day}.json").is_file()]
    return json.loads(files[0].read_text()) if files else None


def value(spec: str, *folders: Path) -> str:
    """The text of a `<!-- value: SPEC -->` marker: `NAME:PATH`, or `NAME:PATH - PATH` (the difference of two items
    of the same file), then optionally ` %FORMAT` (a Python format spec such as `+.2f`) and ` x100` (the number
    scaled before it is formatted: a fraction read as points). NAME reads its newest file; `NAME@YYYY-MM-DD` that
    day's file, for a figure a later run has superseded. A string in the file is written as it stands (it was
    rounded when it was written); a number without a format as in a table (`cell`).

    Raises:
        MissingResults: the benchmark has no results file, or a path names nothing in it.
    """
    spec, _, form = spec.partition(" %")
    form, _, scale = form.partition(" x")
    name, _, expression = spec.partition(":")
    name, _, day = name.strip().partition("@")
    record = dated(name, day, *folders) if day else newest(name, *folders)
    if record is None:
        raise MissingResults(f"no results file for `<!-- value: {name}{'@' + day if day else ''}:… -->`: run the "
                             "benchmark that writes it, or remove the value")
    terms = [lookup(record, path.strip()) for path in expression.split(" - ")]
    if len(terms) == 1 and not form and not scale:
        return str(terms[0]) if isinstance(terms[0], str) else cell(terms[0])
    try:
        numbers = [float(term) for term in terms]
    except (TypeError, ValueError):
        raise MissingResults(f"`{expression}` in {name}'s file is not a number: {terms}") from None
    number = (numbers[0] - sum(numbers[1:])) * (float(scale) if scale else 1)
    return format(number, form) if form else cell(number)


def render(text: str, *folders: Path, commit: bool = True) -> str:
    """`text` with every results block and every value filled from `folders` (default: as `newest`).

    Raises:
        MissingResults: a block or value names a benchmark with no results file, a value a path its file lacks,
            or a value marker does not close on its own line (it would be left as it stands).
    """
    def fill(match: re.Match) -> str:
        record = newest(match.group(2), *folders)
        if record is None:
            raise MissingResults(f"no results file for `<!-- results: {match.group(2)} -->`: run the benchmark that "
                                 "writes it, or remove the block")
        return match.group(1) + table(record, commit) + match.group(4)

    def fill_value(match: re.Match) -> str:
        return match.group(1) + value(match.group(2), *folders) + match.group(4)

    if len(VALUE_START.findall(text)) != len(VALUE.findall(text)):
        broken = [line for line in text.splitlines() if len(VALUE_START.findall(line)) != len(VALUE.findall(line))]
        raise MissingResults(f"a value marker does not close on its own line: {broken[0][:120]}")
    return VALUE.sub(fill_value, BLOCK.sub(fill, text))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        try:
            new = render(text, commit=page.name != "README.md")
        except MissingResults as error:
            print(f"{page.relative_to(ROOT)}: {error}", file=sys.stderr)
            return 2
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    for page in stale:
        print(f"{'out of date' if args.check else 'rendered'}: {page.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
