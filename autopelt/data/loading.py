"""Loading a task's splits: from a local data directory, else from the Hugging Face hub.

A local directory is laid out `<dir>/<task>/<split>.jsonl|csv|parquet` with the hub's column names
(MNLI-mismatched reads `<dir>/mnli/validation_mismatched.*`). `AUTOPELT_DATA_DIR` is the default directory.
When a directory is given it is the only source, so a typo in it is an error, not a silent download.
A task that names its own files (`Task.files`, from `--train-file`/`--validation-file`) is read from them alone.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

from autopelt import hub
from autopelt.data.files import find_split_file, read_rows
from autopelt.data.tasks import Task, get_task
from autopelt.errors import UserError

DATA_DIR_ENV = "AUTOPELT_DATA_DIR"


def load_task_splits(task: str | Task, data_dir: str | Path | None = None, splits=None) -> dict[str, list[dict]]:
    """Split name -> rows for `task`, checked for its columns. Default splits: its train and test splits, and
    its extra test splits (MNLI mismatched) where present: a local folder may leave those out."""
    task = get_task(task)
    wanted = tuple(splits or (task.train_split, task.test_split, *task.extra_test_splits))
    optional = () if splits else task.extra_test_splits
    data_dir = data_dir or os.environ.get(DATA_DIR_ENV) or None
    if task.files:
        rows = _load_files(task, wanted, optional)
    elif data_dir:
        rows = _load_local(task, Path(data_dir).expanduser(), wanted, optional)
    else:
        rows = _load_hub(task, wanted)
    for split, split_rows in rows.items():
        _check_columns(task, split, split_rows)
    return rows


def _load_local(task: Task, data_dir: Path, splits: tuple[str, ...], optional=()) -> dict[str, list[dict]]:
    folder = data_dir / task.dataset
    if not folder.is_dir():
        raise UserError(f"no folder {folder} for task {task.name!r}; expected {_expected_files(task, folder)}")
    rows = {}
    for split in splits:
        path = find_split_file(folder, split)
        if path is None and split in optional:
            continue
        if path is None:
            raise UserError(f"task {task.name!r}: no {split} split in {folder} (expected {split}.jsonl|csv|parquet)")
        rows[split] = read_rows(path)
    return rows


def _load_files(task: Task, splits: tuple[str, ...], optional=()) -> dict[str, list[dict]]:
    files = dict(task.files)
    missing = [split for split in splits if split not in files and split not in optional]
    if missing:
        raise UserError(f"task {task.name!r}: no file for its {missing[0]} split (--{missing[0]}-file)")
    return {split: read_rows(Path(files[split])) for split in splits if split in files}


def _load_hub(task: Task, splits: tuple[str, ...]) -> dict[str, list[dict]]:
    offline = check_hub_data(task)
    try:
        with hub.datasets_offline() if offline else nullcontext():
            dataset = _hub_load_dataset(task.hub_path, task.dataset)
    except Exception as error:  # offline, unreachable, missing package: every cause gets the same advice
        raise UserError(_hub_failure_message(task, f"{type(error).__name__}: {_first_line(error)}")) from None
    missing = [split for split in splits if split not in dataset]
    if missing:
        raise UserError(f"hub dataset {task.hub_path}/{task.dataset} has no split {missing[0]!r}")
    return {split: dataset[split].to_list() for split in splits}


def check_hub_data(task: Task) -> bool:
    """Whether the task must come from the `datasets` cache (the hub cannot be asked); UserError at once when it
    cannot and the cache lacks it. Fast: offline mode, or one failed connection, decides (no client retries)."""
    if task.hub_path is None:
        raise UserError(
            f"task {task.name!r} has no hub dataset; pass --data-dir DIR with "
            f"{_expected_files(task, Path('DIR') / task.dataset)}, or set {DATA_DIR_ENV}=DIR"
        )
    reason = hub.unreachable(datasets=True)
    if reason is None:
        return False
    if not hub.datasets_cache_holds(task.hub_path, task.dataset):
        raise UserError(_hub_failure_message(task, f"{reason}; not in the datasets cache either"))
    return True


def _hub_load_dataset(path: str, name: str):
    import datasets  # heavy, and only the hub path needs it

    return datasets.load_dataset(path, name)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _hub_failure_message(task: Task, cause: str) -> str:
    return (
        f"cannot load GLUE task {task.name!r}: the hub is unreachable ({cause}) "
        f"and no local data was given; pass --data-dir DIR with "
        f"{_expected_files(task, Path('DIR') / task.dataset)}, or set {DATA_DIR_ENV}=DIR"
    )


def _expected_files(task: Task, folder: Path) -> str:
    return f"{folder / task.train_split}.jsonl and {folder / task.test_split}.jsonl (or .csv/.parquet)"


def _check_columns(task: Task, split: str, rows: list[dict]) -> None:
    if not rows:
        raise UserError(f"task {task.name!r}: the {split} split is empty")
    for number, row in enumerate(rows, 1):
        missing = [column for column in task.columns if column not in row]
        if missing:
            raise UserError(
                f"task {task.name!r}: row {number} of the {split} split has no column {missing[0]!r} "
                f"(needs {', '.join(task.columns)}; has {', '.join(map(str, row))})"
            )
