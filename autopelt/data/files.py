"""Reading one split file (JSON lines, CSV or Parquet) into a list of row dicts."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from autopelt.errors import UserError

# Looked for in this order when several formats of one split sit side by side.
EXTENSIONS = (".jsonl", ".csv", ".parquet")


def find_split_file(folder: Path, split: str) -> Path | None:
    """The file holding `split` in `folder` (`<split>.jsonl|csv|parquet`), or None."""
    for extension in EXTENSIONS:
        path = folder / f"{split}{extension}"
        if path.is_file():
            return path
    return None


def read_rows(path: Path) -> list[dict]:
    """Every row of a .jsonl (or .json, JSON Lines), .csv or .parquet file, as dicts.

    Raises UserError for a missing file, another extension, or a line that is not a JSON object."""
    readers = {".jsonl": _read_jsonl, ".json": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}
    if path.suffix not in readers:
        raise UserError(f"cannot read {path}: use .jsonl, .csv or .parquet")
    if not path.is_file():
        raise UserError(f"no file {path}")
    return readers[path.suffix](path)


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                rows.append(_parse_line(path, number, line))
    return rows


def _parse_line(path: Path, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{number}: not valid JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise UserError(f"{path}:{number}: expected a JSON object per line")
    return row


def _read_csv(path: Path) -> list[dict]:
    # CSV values are strings; labels are converted by the task (`Task.encode_label`) when tokenising.
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet  # installed with `datasets`; only Parquet users need it

    return pyarrow.parquet.read_table(path).to_pylist()
