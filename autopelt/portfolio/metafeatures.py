"""What a task looks like, read from its training rows before any training: the meta-features by which the
task-aware prior finds the meta-dataset's tasks most like it (as auto-sklearn 1.0's meta-learning warm start and
TabRepo's zero-shot selection do with a task's description).

    classes      the number of classes (1 for a regression)
    rows         the training rows a trial trains on
    mean_tokens  the mean tokens a row's text(s) take in the model's tokenizer (whitespace words without one),
                 before truncation
    pair         the task reads two texts (NLI, paraphrase, stance toward a target)
    regression   a numeric label
    imbalance    1 - the normalised entropy of the training labels (0: balanced; 1: one class)

`vector` puts them on the scales distances are taken on: logarithms of counts, the flags and imbalance as they are.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

SAMPLE_ROWS = 2000  # rows read for the token count; the labels are counted on all of them
NAMES = ("classes", "rows", "mean_tokens", "pair", "regression", "imbalance")


@dataclass(frozen=True)
class MetaFeatures:
    classes: int
    rows: int
    mean_tokens: float
    pair: bool
    regression: bool
    imbalance: float

    def vector(self) -> np.ndarray:
        """(6,) float64 in the order of NAMES: log2 classes, log10 rows, log2 mean tokens, the flags, imbalance."""
        return np.array([math.log2(max(self.classes, 1)), math.log10(max(self.rows, 1)),
                         math.log2(max(self.mean_tokens, 1.0)), float(self.pair), float(self.regression),
                         self.imbalance])

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> MetaFeatures:
        return cls(**{name: data[name] for name in NAMES})

    def describe(self) -> str:
        kind = "regression" if self.regression else f"{self.classes} classes"
        return f"{kind}, {'text pairs' if self.pair else 'single texts'}, ~{self.mean_tokens:.0f} tokens a row"


def compute(rows: list[dict], text_columns, label_column: str, regression: bool, train_rows: int | None = None,
            tokenizer=None) -> MetaFeatures:
    """The meta-features of a task from its training rows.

    Args:
        rows: the training split's rows (dicts with the text and label columns).
        text_columns: the column(s) holding the text; two make a pair task.
        label_column: the column holding the label.
        regression: whether the label is a number to predict.
        train_rows: the rows a trial trains on (K of the K-shot protocol); default len(rows).
        tokenizer: a transformers tokenizer for `mean_tokens`; None counts whitespace words.

    Returns:
        MetaFeatures.
    """
    columns = tuple(text_columns)
    sample = rows[:: max(1, len(rows) // SAMPLE_ROWS)][:SAMPLE_ROWS]
    texts = [" ".join(str(row.get(c) or "") for c in columns) for row in sample]
    if tokenizer is not None and texts:
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    else:
        lengths = [len(text.split()) for text in texts]
    mean_tokens = float(np.mean(lengths)) if lengths else 0.0
    if regression:
        classes, imbalance = 1, 0.0
    else:
        counts = Counter(str(row.get(label_column)) for row in rows)
        classes = len(counts)
        imbalance = _imbalance(list(counts.values()))
    return MetaFeatures(classes=classes, rows=int(train_rows if train_rows is not None else len(rows)),
                        mean_tokens=round(mean_tokens, 2), pair=len(columns) > 1, regression=bool(regression),
                        imbalance=round(imbalance, 4))


def _imbalance(counts: list[int]) -> float:
    if len(counts) < 2:
        return 1.0
    total = sum(counts)
    entropy = -sum(c / total * math.log(c / total) for c in counts if c)
    return max(0.0, 1.0 - entropy / math.log(len(counts)))
