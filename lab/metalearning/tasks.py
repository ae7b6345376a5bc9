"""The tasks of the shipped meta-dataset, and the fixed pool of rows each contributes.

A task's pool is a fixed draw (seed 0) of at most 2,000 of its training rows and at most 2,000 of its test rows,
written as own data (`train.jsonl`, `validation.jsonl`, text labels in `label`). Every trial of the meta-dataset
runs UniPELT's K-shot protocol on the pool: K=1,000 training rows and the other 1,000 as dev, drawn by the data
seed; the test rows only ever report. A pool makes the meta-dataset the same wherever it is collected, and small
enough to carry to a GPU machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autopelt.errors import UserError
from autopelt.files import write_atomic

POOL_TRAIN_ROWS = 2000
POOL_TEST_ROWS = 2000
POOL_SEED = 0
K, DEV_SIZE = 1000, 1000


@dataclass(frozen=True)
class MetaTask:
    name: str
    folder: str  # under the data root
    text_columns: tuple[str, ...]
    label_column: str = "label"
    label_values: dict | None = None  # numeric labels -> names (GLUE's SST-2)
    regression: bool = False  # a numeric label, scored by Pearson correlation


META_TASKS = (
    MetaTask("sst2", "glue-full/sst2", ("sentence",), label_values={0: "negative", 1: "positive"}),
    MetaTask("snli", "own/snli", ("premise", "hypothesis"), label_column="relation"),
    *(MetaTask(name, f"tasks/{name}", ("text",)) for name in
      ("tweeteval_emotion", "tweeteval_offensive", "tweeteval_hate", "mr", "subj", "mpqa", "trec", "cola")),
    MetaTask("tweeteval_stance", "tasks/tweeteval_stance", ("target", "text")),
    MetaTask("qnli", "tasks/qnli", ("question", "sentence")),
    # design v2: many classes, few easy classes, ordinal, long inputs, an adversarial pair, a regression
    *(MetaTask(name, f"tasks/{name}", ("text",)) for name in
      ("trec_fine", "sst5", "clinc150", "hwu64", "snips", "bbc_news", "go_emotions")),
    MetaTask("paws", "tasks/paws", ("sentence1", "sentence2")),
    MetaTask("emobank_valence", "tasks/emobank_valence", ("text",), regression=True),
)


def meta_task(name: str) -> MetaTask:
    for task in META_TASKS:
        if task.name == name:
            return task
    raise UserError(f"unknown meta-dataset task {name!r}; tasks: {', '.join(t.name for t in META_TASKS)}")


def build_pool(data_root: str | Path, out: str | Path, tasks=META_TASKS) -> dict:
    """Write every task's pool under `out` and `out/pool.json` (columns and label names per task); returns it."""
    data_root, out = Path(data_root), Path(out)
    manifest = {}
    for task in tasks:
        source = data_root / task.folder
        train = _draw(_read(source / "train.jsonl"), POOL_TRAIN_ROWS)
        test = _draw(_read(source / "validation.jsonl"), POOL_TEST_ROWS)
        rows = {"train": [_row(task, r) for r in train], "validation": [_row(task, r) for r in test]}
        # every label of either split, so that a test row of a class the draw left out of train still encodes
        labels = [] if task.regression else sorted({r["label"] for split in rows.values() for r in split})
        if not task.regression and len({r["label"] for r in rows["train"]}) < 2:
            raise UserError(f"{source}: its pool holds one label; a task needs two or more")
        (out / task.name).mkdir(parents=True, exist_ok=True)
        for split, split_rows in rows.items():
            write_atomic(out / task.name / f"{split}.jsonl", "".join(json.dumps(r) + "\n" for r in split_rows))
        manifest[task.name] = {"text_columns": list(task.text_columns), "train_rows": len(train),
                               "test_rows": len(test), "dev_size": min(DEV_SIZE, len(train) - K),
                               **({"regression": True} if task.regression else {"label_names": labels})}
    write_atomic(out / "pool.json", json.dumps(manifest, indent=1))
    return manifest


def read_pool(pool: str | Path) -> dict:
    path = Path(pool) / "pool.json"
    if not path.exists():
        raise UserError(f"{pool} is not a meta-dataset pool (no pool.json); make one with "
                        "`python -m metalearning pool --data-root DIR --out DIR`")
    return json.loads(path.read_text())


def pool_task(pool: str | Path, name: str) -> dict:
    """A pool task as a trial's own task (`TrialSettings.custom_task`): its text columns and label names."""
    meta = read_pool(pool)[name]
    if meta.get("regression"):
        return {"text_columns": meta["text_columns"], "label_column": "label", "regression": True}
    return {"text_columns": meta["text_columns"], "label_column": "label", "label_names": meta["label_names"]}


def dev_size(pool: str | Path, name: str) -> int:
    """The task's dev rows: 1,000, or what its pool holds beyond K (bbc_news's 1,782 train rows leave 782)."""
    return int(read_pool(pool)[name].get("dev_size", DEV_SIZE))


def dev_rows(pool: str | Path, name: str):
    """(the task, its dev rows' label ids, as a trial of the meta-dataset carves them from the pool: K=1,000 and
    1,000 dev at data seed 0)."""
    from autopelt.data import load_task_splits, make_splits
    from autopelt.train.settings import TrialSettings
    from autopelt.train.trial_data import resolve_task

    settings = TrialSettings(task=name, spec="lora", data_dir=str(pool), protocol=K, dev_size=dev_size(pool, name),
                             seed=0,
                             data_seed=0, custom_task=pool_task(pool, name))
    task = resolve_task(settings)
    splits = make_splits(load_task_splits(task, str(pool)), task, K, seed=settings.split_seed, dev_size=DEV_SIZE)
    return task, np.asarray([task.encode_label(row[task.label_column]) for row in splits.dev],
                            dtype=np.float32 if task.regression else np.int64)


def dev_floors(pool: str | Path, names: list[str]) -> dict[str, float]:
    """Each task's dev metric of predicting one class (the best such class) on its meta-dataset dev rows: what a
    trial that learned nothing scores, so that a collapse can be told from a task that is merely hard."""
    from types import SimpleNamespace

    from autopelt.train.lr_sweep import one_class_metric

    floors = {}
    for name in names:
        task, labels = dev_rows(pool, name)
        floor = one_class_metric(SimpleNamespace(task=task, dev=SimpleNamespace(labels=labels)))
        floors[name] = 0.0 if floor is None else round(floor, 5)  # a constant prediction correlates 0
    return floors


def _read(path: Path) -> list[dict]:
    if not path.exists():
        raise UserError(f"{path} does not exist; --data-root must hold glue-full/, own/ and tasks/")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _draw(rows: list[dict], limit: int) -> list[dict]:
    if len(rows) <= limit:
        return rows
    keep = np.random.default_rng(POOL_SEED).permutation(len(rows))[:limit]
    return [rows[i] for i in sorted(keep)]


def _row(task: MetaTask, row: dict) -> dict:
    label = row[task.label_column]
    if task.label_values is not None:
        label = task.label_values[label]
    return {**{c: row[c] for c in task.text_columns}, "label": float(label) if task.regression else str(label)}
