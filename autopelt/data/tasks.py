"""What a task is: its text columns, labels and metric. Every GLUE task, plus a user's own.

A `Task` is plain data: the loader reads its columns, the tokeniser its text columns, the trainer its
`num_labels`/`problem_type`, and the search maximises `metric` (every main metric here is higher-is-better).

Main metrics (all variants are reported in the metrics dict):
- CoLA: `matthews_correlation`.
- MRPC, QQP: `accuracy` (with `f1` and `combined_score` = their mean). Accuracy, not F1, because it is what
  the low-resource PELT papers select on and it does not reward predicting the positive class everywhere.
- STS-B: `pearson` (with `spearman` and `combined_score`), the first of GLUE's pair.
- every other task: `accuracy`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autopelt.data import metrics
from autopelt.errors import UserError

GLUE_HUB_PATH = "nyu-mll/glue"


@dataclass(frozen=True)
class Task:
    """A text classification or regression task read from named columns."""

    name: str
    text_columns: tuple[str, ...]
    num_labels: int
    regression: bool = False
    label_names: tuple[str, ...] = ()
    metric: str = "accuracy"
    metric_fn: Callable = field(default=metrics.accuracy, repr=False, compare=False)
    label_column: str = "label"
    dataset: str = ""  # folder under a data dir, and the hub config name; defaults to `name`
    hub_path: str | None = GLUE_HUB_PATH
    train_split: str = "train"
    test_split: str = "validation"  # the official validation split is the protocols' test set
    extra_test_splits: tuple[str, ...] = ()  # further test sets scored by the same trained delta (MNLI mismatched)
    files: tuple[tuple[str, str], ...] = ()  # (split, file) pairs read in place of a data dir (--train-file …)

    def __post_init__(self):
        if not self.dataset:
            object.__setattr__(self, "dataset", self.name)

    @property
    def problem_type(self) -> str:
        """The `transformers` config `problem_type` matching this task."""
        return "regression" if self.regression else "single_label_classification"

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column a row must have."""
        return (*self.text_columns, self.label_column)

    def predictions(self, outputs) -> np.ndarray:
        """Model outputs (logits (N, C), or scores (N,) / (N, 1)) -> class ids or scores (N,)."""
        outputs = _to_numpy(outputs)
        if self.regression:
            return outputs.reshape(len(outputs))
        return outputs.argmax(axis=-1) if outputs.ndim == 2 else outputs.astype(np.int64)

    def compute_metrics(self, outputs, labels) -> dict[str, float]:
        """Every metric of this task, from logits/scores or predicted ids and the gold labels."""
        return self.metric_fn(self.predictions(outputs), _to_numpy(labels))

    def encode_label(self, value):
        """A raw label (int, float, digit string, or label name) -> int class id or float score."""
        if self.regression:
            return _to_float(self, value)
        if isinstance(value, str) and value in self.label_names:
            return self.label_names.index(value)
        return _to_class_id(self, value)


def _to_numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def _to_float(task: Task, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"task {task.name!r}: label {value!r} is not a number (regression)") from None


def _to_class_id(task: Task, value) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    # -1 marks an unlabelled row, as in the hub's GLUE test splits
    if number is None or not number.is_integer() or not -1 <= number < task.num_labels:
        names = f" or one of {list(task.label_names)}" if task.label_names else ""
        raise UserError(
            f"task {task.name!r}: label {value!r} is not a class id 0..{task.num_labels - 1}{names}"
        )
    return int(number)


def _glue(name, text_columns, label_names, metric="accuracy", metric_fn=metrics.accuracy, **extra) -> Task:
    return Task(
        name=name, text_columns=text_columns, num_labels=len(label_names), label_names=label_names,
        metric=metric, metric_fn=metric_fn, **extra,
    )


_PAIR = ("sentence1", "sentence2")
_NLI = ("premise", "hypothesis")
_MNLI_LABELS = ("entailment", "neutral", "contradiction")

GLUE_TASKS: dict[str, Task] = {
    "cola": _glue("cola", ("sentence",), ("unacceptable", "acceptable"), "matthews_correlation", metrics.matthews),
    "sst2": _glue("sst2", ("sentence",), ("negative", "positive")),
    "mrpc": _glue("mrpc", _PAIR, ("not_equivalent", "equivalent"), metric_fn=metrics.accuracy_and_f1),
    "qqp": _glue("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"),
                 metric_fn=metrics.accuracy_and_f1),
    "stsb": Task(name="stsb", text_columns=_PAIR, num_labels=1, regression=True, metric="pearson",
                 metric_fn=metrics.pearson_and_spearman),
    "mnli": _glue("mnli", _NLI, _MNLI_LABELS, test_split="validation_matched",
                  extra_test_splits=("validation_mismatched",)),
    "mnli-mm": _glue("mnli-mm", _NLI, _MNLI_LABELS, dataset="mnli", test_split="validation_mismatched"),
    "qnli": _glue("qnli", ("question", "sentence"), ("entailment", "not_entailment")),
    "rte": _glue("rte", _PAIR, ("entailment", "not_entailment")),
    "wnli": _glue("wnli", _PAIR, ("not_entailment", "entailment")),
}

ALIASES = {
    "sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli_matched": "mnli", "mnli-matched": "mnli",
    "mnli_mm": "mnli-mm", "mnli_mismatched": "mnli-mm", "mnli-mismatched": "mnli-mm",
}


def get_task(name: str | Task) -> Task:
    """A GLUE task by name (case-insensitive, common aliases accepted); a Task passes through."""
    if isinstance(name, Task):
        return name
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in GLUE_TASKS:
        raise UserError(f"unknown task {name!r}; valid tasks: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def custom_task(
    name: str,
    text_columns: str | list[str] | tuple[str, ...],
    label_column: str = "label",
    num_labels: int | None = None,
    regression: bool = False,
    label_names: list[str] | tuple[str, ...] | None = None,
    test_split: str = "validation",
    files: dict[str, str] | None = None,
) -> Task:
    """A user's task from named columns: give `num_labels` or `label_names` (classification) or `regression`.

    `files` maps split names (`train`, `validation`) to the files that hold them; without it the splits are read
    from a data dir, `<dir>/<name>/<split>.jsonl|csv|parquet`.
    """
    columns = (text_columns,) if isinstance(text_columns, str) else tuple(text_columns)
    if len(columns) not in (1, 2):
        raise UserError(f"task {name!r}: give one or two text columns (a sentence or a pair), not {len(columns)}")
    label_names = tuple(label_names or ())
    count = _num_labels(name, num_labels, regression, label_names)
    metric, metric_fn = ("pearson", metrics.pearson_and_spearman) if regression else (
        "accuracy", metrics.accuracy_and_macro_f1)
    return Task(
        name=name, text_columns=columns, num_labels=count, regression=regression, label_names=label_names,
        metric=metric, metric_fn=metric_fn, label_column=label_column, hub_path=None, test_split=test_split,
        files=tuple(sorted((files or {}).items())),
    )


def _num_labels(name: str, num_labels: int | None, regression: bool, label_names: tuple[str, ...]) -> int:
    if regression:
        if label_names or num_labels not in (None, 1):
            raise UserError(f"task {name!r}: a regression task has no label names and num_labels 1")
        return 1
    count = num_labels if num_labels is not None else len(label_names)
    if count < 2 or (label_names and len(label_names) != count):
        raise UserError(
            f"task {name!r}: give num_labels >= 2 or label_names (matching num_labels), or regression=True"
        )
    return count
