"""The search's task and its data, found and checked before the study exists: the task (a named one, your own
columns, or your own input -> target text), the folder its files are read from, and its rows as every trial will
read them. Each bad input is one UserError here, not a failure of every trial."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from autopelt.errors import UserError


def task_of(name: str, custom: dict | None):
    """A Task (classification, regression), or a GenerationTask for your own input -> target columns."""
    from autopelt.data import custom_task, get_task
    from autopelt.data.generation import generation_task_of

    generation = generation_task_of(name, custom)
    if generation is not None:
        return generation
    return custom_task(name, **custom) if custom else get_task(name)


def data_dir_of(given: str | None, task, generation: bool) -> str | None:
    """The task's data folder, absolute (Ray workers run elsewhere), checked to hold its files; None where the
    rows come from elsewhere: the hub, or the files your own task names."""
    if generation:
        return _generation_data_dir(given, task)
    return None if task.files else _data_dir(given, task)


def check_data(task, data_dir: str | None, protocol, seed: int):
    """The task's data as every trial will read it (`autopelt.data.check`): a file, column, label, K or dev size
    that would fail every trial is one UserError now, before the study exists. Hub data is loaded once here:
    offline, that is one clear error; online, the workers then find it in the `datasets` cache. Returns the
    DataCheck and the splits' rows as loaded (split name -> rows)."""
    from autopelt.data.check import load_and_check

    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)  # the hub client logs every retry of an unreachable host
    try:
        return load_and_check(task, data_dir, protocol, seed=seed)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _generation_data_dir(given: str | None, task) -> str:
    """The data folder of a generation task (absolute), its files and both columns checked: one line, no study."""
    from autopelt.data.generation import load_generation_splits

    folder = _data_folder(given)
    if folder is None:
        raise UserError("a generation task reads your own data: pass --data-dir DIR holding "
                        f"DIR/{task.name}/train.jsonl")
    load_generation_splits(task, str(folder))
    return str(folder)


def _data_dir(given: str | None, task) -> str | None:
    """The local data folder (absolute), checked to hold the task's splits; None: the hub."""
    from autopelt.data.files import find_split_file

    folder = _data_folder(given)
    if folder is None:
        return None
    for split in (task.train_split, task.test_split):
        if find_split_file(folder / task.dataset, split) is None:
            value = given or os.environ.get("AUTOPELT_DATA_DIR")
            raise UserError(f"--data-dir {value}: no {task.dataset}/{split}.jsonl|csv|parquet for task {task.name!r}")
    return str(folder)


def _data_folder(given: str | None) -> Path | None:
    """--data-dir, else $AUTOPELT_DATA_DIR, as an absolute folder that exists; None when neither is set."""
    value = given or os.environ.get("AUTOPELT_DATA_DIR")
    if not value:
        return None
    folder = Path(value).expanduser().resolve()
    if not folder.is_dir():
        raise UserError(f"--data-dir {value} is not a folder")
    return folder
