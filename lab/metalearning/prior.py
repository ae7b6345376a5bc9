"""The task-aware prior, built from the meta-dataset: every task's meta-features and dev scores, and `k`, the
number of nearest tasks a new task's portfolio is learned from, chosen by leave-one-task-out.

`choose_k` scores each candidate k by leaving each task out in turn: the prior is built from the other tasks, the
held-out task's portfolio is chosen from its k nearest, and successive halving over that portfolio is simulated on
the held-out task's trials at `BUDGET` full-trial equivalents (simulate.py); the test metric of the answer (chosen
by dev) is averaged over tasks and seeds. `nested_k` does the same without one more task, so that the k a
held-out task is judged with was chosen without it (bench/portfolio_loo.py reports that way).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from autopelt.portfolio import metafeatures
from autopelt.portfolio.metafeatures import MetaFeatures
from autopelt.portfolio.prior import Prior, unlike_threshold
from metalearning import metadata, simulate
from metalearning.design import config_named
from metalearning.tasks import K, read_pool

CANDIDATE_K = (2, 3, 5, 8, 12)  # and every task (the global portfolio)
BUDGET = 8
SIZE = 16


def task_features(pool: str | Path, tokenizer=None) -> dict[str, MetaFeatures]:
    """Each pool task's meta-features from its pool train rows (K of them are what a trial trains on)."""
    import json

    out = {}
    for name, meta in read_pool(pool).items():
        rows = [json.loads(line) for line in (Path(pool) / name / "train.jsonl").read_text().splitlines() if line]
        out[name] = metafeatures.compute(rows, meta["text_columns"], "label", bool(meta.get("regression")),
                                         train_rows=K, tokenizer=tokenizer)
    return out


def features_of(meta: metadata.MetaDataset) -> dict[str, MetaFeatures]:
    """The meta-features recorded in the meta-dataset's header (`python -m metalearning finish --pool`)."""
    from autopelt.errors import UserError

    if "features" not in meta.header:
        raise UserError("the meta-dataset records no task meta-features; finish it again with --pool")
    return {name: MetaFeatures.from_dict(entry) for name, entry in meta.header["features"].items()}


def scores(meta: metadata.MetaDataset, tasks: list[str]) -> dict[str, dict[str, float]]:
    """task -> configuration -> dev at full fidelity: the global portfolio's scores (MetaDataset.dev_scores, the
    mean over the selection seeds), so that the prior over every task is the global portfolio."""
    return meta.dev_scores(tasks, meta.candidates())


def build(meta: metadata.MetaDataset, features: dict[str, MetaFeatures], k: int,
          tasks: list[str] | None = None) -> Prior:
    """The prior over `tasks` (default: every task of the meta-dataset); k >= len(tasks) is the global one."""
    tasks = tasks or meta.tasks
    chosen = {t: features[t] for t in tasks}
    configs = {c: config_named(c) for c in meta.candidates()}
    return Prior(k=min(k, len(tasks)), tasks=chosen, scores=scores(meta, tasks), configs=configs,
                 unlike=unlike_threshold(chosen))


def held_out_test(meta, features, task: str, k: int, without: tuple[str, ...] = ()) -> float:
    """The test metric of successive halving over the task-aware portfolio at BUDGET on `task`, the prior built
    from the tasks other than `task` and `without`; the mean over the seeds collected for `task`."""
    others = [t for t in meta.tasks if t != task and t not in without]
    prior = build(meta, features, k, others)
    members, _, _ = prior.portfolio(features[task], SIZE)
    names = [m.name for m in members]
    return statistics.mean(simulate.Task(meta, task, seed=s).halving(names, BUDGET, favourite=True).test
                           for s in task_seeds(meta, task, names))


def task_seeds(meta, task: str, configs: list[str]) -> list[int]:
    """The seeds at which every one of `configs` was collected on `task` (seed 0 always is)."""
    return [s for s in meta.seeds if all(meta.trial(task, c, s) for c in configs)] or [0]


def choose_k(meta, features, without: tuple[str, ...] = ()) -> tuple[int, dict[int, float]]:
    """(the k of the best mean held-out test metric, every candidate's mean); ties to the larger k."""
    tasks = [t for t in meta.tasks if t not in without]
    means = {k: statistics.mean(held_out_test(meta, features, t, k, without) for t in tasks)
             for k in (*CANDIDATE_K, len(tasks) - 1)}
    best = max(means, key=lambda k: (round(means[k], 6), k))
    return best, means


def nested_k(meta, features, task: str) -> int:
    """The k chosen by leave-one-task-out without `task`: what `task` is judged with."""
    return choose_k(meta, features, without=(task,))[0]
