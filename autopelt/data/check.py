"""A task's data checked as every trial will read it, once, before the first trial: its files and columns, its
labels, and the protocol's splits (K and the dev size against the train rows). What would fail every trial is a
UserError here; what was inferred is said in one line (`DataCheck.line`), and a dev split too small to rank deltas
in another (`DataCheck.warning`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from autopelt.data.tasks import Task
from autopelt.errors import UserError

SMALL_DEV_ROWS = 100  # below this a dev split's standard error is wider than most gaps between deltas
NAMED_CLASSES = 6  # at most this many class names are printed; more are counted
SAMPLE_ROWS = 256  # train rows kept to size a trial's batches (search/budget_fit.py)


@dataclass(frozen=True)
class DataCheck:
    """What the data of a task holds under a protocol, as its trials will see it."""

    task: Task
    sizes: dict[str, int]  # train, dev, test rows of the protocol's splits
    classes: tuple[str, ...]  # the labels found in the train split (a classification task), in id order
    sample: tuple[dict, ...] = ()  # the first SAMPLE_ROWS rows a trial trains on (what sizes its batches)

    def line(self) -> str:
        """`data: text sentence1 + sentence2, label 'label' (2 classes: entailment, not_entailment); train 100 ·
        dev 1,000 · test 277`"""
        task = self.task
        if task.regression:
            labels = f"label {task.label_column!r} (a number: regression)"
        else:
            names = task.label_names or self.classes
            shown = f": {', '.join(names)}" if 0 < len(names) <= NAMED_CLASSES else ""
            labels = f"label {task.label_column!r} ({task.num_labels} classes{shown})"
        sizes = " · ".join(f"{split} {rows:,}" for split, rows in self.sizes.items())
        return f"data: text {' + '.join(task.text_columns)}, {labels}; {sizes}"

    def warning(self) -> str | None:
        """A line when the dev split is too small to rank deltas (the standard error of its metric), else None."""
        rows = self.sizes.get("dev", 0)
        if rows >= SMALL_DEV_ROWS:
            return None
        error = 0.5 / math.sqrt(max(rows, 1))  # of an accuracy near 0.5, its largest
        return (f"warning: the dev split has {rows:,} rows: a dev {self.task.metric} has a standard error of up to "
                f"{error:.2f}, so deltas closer than that are ranked by chance (more train rows, or a smaller --k, "
                f"leave a larger dev split)")


def check_task_data(task: Task, data_dir: str | Path | None, protocol: str | int, seed: int = 0,
                    dev_size: int | None = None) -> DataCheck:
    """Load the task's splits, check every label and the protocol's split sizes, as a trial would.

    Args:
        task: the task (its columns, labels and splits).
        data_dir: its local data folder; None for its own files (`task.files`) or the hub.
        protocol: "full" or K, as `make_splits` takes it.
        seed: the data seed (which rows form train and dev).
        dev_size: the dev rows; None for the protocol's default.
    Returns:
        The `DataCheck`: the split sizes and the classes found.
    Raises:
        UserError: a file or column missing, a label that is not a class or a number, a label column with a single
            value, K or the dev size that the train split cannot hold.
    """
    return load_and_check(task, data_dir, protocol, seed, dev_size)[0]


def load_and_check(task: Task, data_dir: str | Path | None, protocol: str | int, seed: int = 0,
                   dev_size: int | None = None) -> tuple[DataCheck, dict[str, list[dict]]]:
    """`check_task_data`, and the splits' rows as loaded (split name -> rows), for a caller that reads them too
    (the search's meta-features), so that the files are read once."""
    from autopelt.data.loading import load_task_splits
    from autopelt.data.protocols import make_splits

    loaded = load_task_splits(task, data_dir)
    labels = {split: [task.encode_label(row[task.label_column]) for row in rows]  # a UserError for a label that
              for split, rows in loaded.items()}  # is no class id, class name or number
    classes = _check_label_values(task, labels[task.train_split])
    splits = make_splits(loaded, task, protocol, seed=seed, dev_size=dev_size)
    if not splits.dev:
        raise UserError(f"task {task.name!r}: no train rows are left for dev")
    sizes = {"train": len(splits.train), "dev": len(splits.dev), "test": len(splits.test)}
    return DataCheck(task, sizes, classes, tuple(splits.train[:SAMPLE_ROWS])), loaded


def _check_label_values(task: Task, labels: list) -> tuple[str, ...]:
    """The distinct labels of the train split (encoded), refused when there is only one (nothing to tell apart)."""
    values = set(labels)
    if not task.regression:
        values.discard(-1)  # an unlabelled row (the hub's GLUE test splits)
    if len(values) == 1:
        only = next(iter(values))
        shown = task.label_names[only] if not task.regression and only < len(task.label_names) else only
        kind = "a regression needs labels that vary" if task.regression else "a classifier needs at least two classes"
        raise UserError(f"task {task.name!r}: the label column {task.label_column!r} has a single value, {shown!r}, in "
                        f"its {task.train_split} split; {kind}")
    if task.regression:
        return ()
    return tuple(task.label_names[v] if v < len(task.label_names) else str(v) for v in sorted(values))
