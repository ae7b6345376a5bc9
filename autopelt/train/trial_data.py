"""A trial's data: the task, its protocol's splits, and their token ids (from the on-disk cache)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autopelt.data import Features, Task, custom_task, get_task, load_task_splits, make_splits, tokenize
from autopelt.errors import UserError
from autopelt.train.settings import TrialSettings


@dataclass(frozen=True)
class TrialData:
    task: Task
    train: Features
    dev: Features
    test: Features
    protocol: dict  # sizes and seed, as the result reports them
    extra_tests: dict[str, Features] = field(default_factory=dict)  # split -> features (MNLI mismatched)


def resolve_task(settings: TrialSettings) -> Task:
    """A GLUE task by name, or the user's own task from its named columns (a generation task: its input and target
    columns)."""
    if settings.custom_task and settings.custom_task.get("target_column"):  # generation: torch only then
        from autopelt.train.generate import generation_task

        return generation_task(settings)
    if settings.custom_task:
        return custom_task(settings.task, **settings.custom_task)
    return get_task(settings.task)


def prepare_data(settings: TrialSettings, tokenizer, task: Task | None = None) -> TrialData:
    task = task or resolve_task(settings)
    if settings.data_dir and not Path(settings.data_dir).expanduser().is_dir():
        raise UserError(f"--data-dir {settings.data_dir} is not a folder")
    loaded = load_task_splits(task, settings.data_dir)
    splits = make_splits(loaded, task, settings.protocol, seed=settings.split_seed, dev_size=settings.dev_size)
    train_rows = splits.train
    if settings.max_train_examples and settings.max_train_examples < len(train_rows):
        chosen = np.random.default_rng(settings.split_seed).permutation(len(train_rows))[: settings.max_train_examples]
        train_rows = tuple(train_rows[i] for i in sorted(chosen))

    # Whole splits are tokenised (once per task, tokenizer and max length: the cache key is their content), and
    # a protocol's rows are picked from them, so other seeds, K and subsets reuse the same cache entries.
    tokenised = {split: tokenize(rows, task, tokenizer, settings.max_length, cache_dir=settings.cache_dir)
                 for split, rows in loaded.items()}
    position = {id(row): (split, i) for split, rows in loaded.items() for i, row in enumerate(rows)}

    def features(rows) -> Features:
        places = [position[id(row)] for row in rows]  # the protocols hand out the loaded row objects themselves
        split = places[0][0] if places else task.train_split
        return tokenised[split].select([i for _, i in places])

    protocol = {**splits.info, "train_size": len(train_rows)}
    extra = {split: tokenised[split] for split in task.extra_test_splits if split in loaded}
    protocol.update({f"{split}_size": len(loaded[split]) for split in extra})
    data = TrialData(task, features(train_rows), features(splits.dev), features(splits.test), protocol, extra)
    if settings.distill:
        from autopelt.train.distillation import attach_targets

        data = attach_targets(data, settings.distill)
    return data
