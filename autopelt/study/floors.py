"""Each split's one-class floor, and whether a search learned anything above it.

A split's floor is what a delta that learned nothing scores there: the best metric of predicting one class for
every row (the majority class, for accuracy), or 0 for a regression's correlation (a constant prediction). A dev
value counts as learned only past the floor by `train/lr_sweep.learned_margin` (three standard errors of a
proportion on the dev rows, at least a point): the rule the learning-rate sweep already uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Floors:
    dev: float | None
    test: float | None  # None: the test split has no labels
    dev_rows: int
    metric: str

    def learned(self, dev_value: float) -> bool:
        """The dev value beats predicting one class by more than noise."""
        from autopelt.train.lr_sweep import learned_margin

        return self.dev is None or dev_value > self.dev + learned_margin(self.dev, self.dev_rows)

    def to_dict(self) -> dict:
        return {"dev": self.dev, "test": self.test, "dev_rows": self.dev_rows, "metric": self.metric}

    @classmethod
    def from_dict(cls, data: dict | None) -> Floors | None:
        if not data:
            return None
        return cls(dev=data.get("dev"), test=data.get("test"), dev_rows=int(data.get("dev_rows") or 0),
                   metric=str(data.get("metric") or "accuracy"))


def one_class(task, labels) -> float | None:
    """The best metric of predicting one class for every row of `labels`; 0.0 for a regression (a constant
    correlates with nothing); None without labels."""
    if labels is None or len(labels) == 0:
        return None
    if task.regression:
        return 0.0
    labels = np.asarray(labels)
    return round(max(task.compute_metrics(np.full(len(labels), label, dtype=np.int64), labels)[task.metric]
                     for label in range(task.num_labels)), 5)


def of_settings(settings) -> Floors:
    """The floors of the dev and test rows a trial of `settings` trains and scores on (its protocol and data seed),
    read from the data files without tokenising. Raises UserError as loading the data does."""
    from autopelt.data import load_task_splits, make_splits
    from autopelt.train.trial_data import resolve_task

    task = resolve_task(settings)
    splits = make_splits(load_task_splits(task, settings.data_dir), task, settings.protocol,
                         seed=settings.split_seed, dev_size=settings.dev_size)

    def labels(rows):
        values = [row.get(task.label_column) for row in rows]
        if not values or any(v is None or v == -1 for v in values):  # GLUE's unlabelled test rows carry -1
            return None
        return np.asarray([task.encode_label(v) for v in values])

    return Floors(dev=one_class(task, labels(splits.dev)), test=one_class(task, labels(splits.test)),
                  dev_rows=len(splits.dev), metric=task.metric)


def nothing_learned(floors: Floors | None, devs: list[float], metric_name: str) -> str | None:
    """The nothing-learned line when every dev value in `devs` (the finished trials') is within noise of the dev
    floor; None when one learned, or without floors or values."""
    if floors is None or floors.dev is None or not devs or any(floors.learned(value) for value in devs):
        return None
    return nothing_learned_line(floors, max(devs), metric_name)


def nothing_learned_line(floors: Floors, best_dev: float, metric_name: str) -> str:
    """The one line a search, a report and an export show when every finished trial sits at the dev floor."""
    return (f"nothing learned: every finished trial's dev {metric_name} (best {best_dev:.4f}) is within noise of "
            f"predicting one class ({floors.dev:.4f} on dev"
            + (f", {floors.test:.4f} on test" if floors.test is not None else "")
            + "); try more training rows (--k), more epochs (--epochs) or a larger model (--model)")
