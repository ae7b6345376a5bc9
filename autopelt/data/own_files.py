"""Your own data as two files (`--train-file`, `--validation-file`): the task's columns and labels read from
the train file where the flags leave them out, as Hugging Face's `run_glue.py` reads them.

- Text columns: the given ones; else a known pair present in the file (`sentence1/sentence2`,
  `premise/hypothesis`, `question/sentence`, …); else the one column besides the label that holds text.
- Labels: given names, `--num-labels` or `--regression` win; else text labels give their sorted distinct names,
  whole numbers the classes 0..max, other numbers a regression.
Anything it cannot decide is a UserError that lists the columns it found.
"""

from __future__ import annotations

from pathlib import Path

from autopelt.data.files import read_rows
from autopelt.errors import UserError

# Text pairs that name themselves, first match wins (the GLUE and SNLI column names).
KNOWN_PAIRS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"),
               ("question1", "question2"), ("text1", "text2"))


def task_from_files(name: str, train_file: str, validation_file: str, given: dict) -> dict:
    """The `custom_task` fields (autopelt.data.custom_task) of a task read from two files.

    `given` holds what the flags said: `text_columns` (list or None), `label_column`, `num_labels`,
    `label_names` (list or None), `regression`. Returns them completed from the train file, with `files`
    mapping `train` and `validation` to absolute paths (Ray workers run elsewhere).
    Raises UserError (one line) when a file cannot be read or a column cannot be inferred."""
    train, validation = (Path(f).expanduser().resolve() for f in (train_file, validation_file))
    rows = read_rows(train)
    if not rows:
        raise UserError(f"{train_file} has no rows")
    columns = list(rows[0])
    label = given.get("label_column") or "label"
    if label not in columns:
        raise UserError(f"{train_file}: no label column {label!r} (columns: {', '.join(columns)}); "
                        "pass --label-column")
    text = given.get("text_columns") or infer_text_columns(rows, columns, label, train_file)
    fields = {"text_columns": list(text), "label_column": label,
              "files": {"train": str(train), "validation": str(validation)}}
    return {**fields, **_labels(rows, label, given, train_file)}


def infer_text_columns(rows: list[dict], columns: list[str], label: str, source: str) -> tuple[str, ...]:
    """The text column(s) of `rows`: a known pair, else the only text column besides `label`."""
    for pair in KNOWN_PAIRS:
        if all(column in columns for column in pair):
            return pair
    texts = [c for c in columns if c != label and all(isinstance(row.get(c), str) for row in rows[:100])
             and not all(_is_number(row.get(c)) for row in rows[:100])]
    if len(texts) == 1:
        return (texts[0],)
    raise UserError(f"{source}: cannot tell the text column(s) among {', '.join(columns)}; pass --text-columns")


def _labels(rows: list[dict], label: str, given: dict, source: str) -> dict:
    if given.get("regression"):
        return {"regression": True}
    if given.get("label_names") or given.get("num_labels"):
        return {"num_labels": given.get("num_labels"), "label_names": given.get("label_names")}
    values = {row.get(label) for row in rows}
    values.discard(None)
    if len(values) == 1:
        raise UserError(f"{source}: the label column {label!r} has a single value, {next(iter(values))!r}; a "
                        "classifier needs at least two classes (--label-column names another column)")
    if all(_is_number(v) for v in values):
        numbers = {float(v) for v in values}
        if all(n.is_integer() and n >= 0 for n in numbers):
            return {"num_labels": max(2, int(max(numbers)) + 1), "label_names": None}
        return {"regression": True}
    return {"num_labels": None, "label_names": sorted(str(v) for v in values)}


def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
