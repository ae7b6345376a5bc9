"""Build a portfolio file from a meta-dataset (the shipped prior is built so), with its searched baselines' rates."""

from __future__ import annotations

from autopelt.errors import UserError
from autopelt.portfolio import select
from autopelt.portfolio.config import Config
from autopelt.portfolio.portfolio import to_file
from autopelt.search import phases
from autopelt.search.budget import TimeBudget
from metalearning import metadata
from metalearning.design import DESIGN_VERSION, config_named


def from_meta(meta_path: str, size: int, leave_out: list[str], out: str) -> dict:
    """Greedy selection on the meta-dataset's dev scores (the mean over its selection seeds), without the
    `leave_out` tasks."""
    meta = metadata.shipped() if meta_path == "shipped" else metadata.load(meta_path)
    tasks = _kept_tasks(meta, leave_out)
    scores = meta.dev_scores(tasks, meta.candidates())
    chosen = select.greedy_portfolio(scores, size)
    seeds = ", ".join(map(str, meta.selection_seeds))
    built_from = {"meta_dataset": meta_path, "tasks": tasks, "selection": f"greedy, mean dev over seeds {seeds}",
                  "mean_regret": round(select.mean_regret(scores, chosen), 4)}
    return to_file([config_named(c) for c in chosen], meta.header.get("model"), built_from, out,
                   baseline_rates(meta, tasks), DESIGN_VERSION, calibration=calibration(meta, tasks))


def _kept_tasks(meta, leave_out) -> list[str]:
    """The meta-dataset's tasks without `leave_out`; UserError for a task it does not hold or fewer than two kept."""
    unknown = [t for t in leave_out if t not in meta.tasks]
    if unknown:
        raise UserError(f"--leave-out {unknown[0]}: not a task of the meta-dataset ({', '.join(meta.tasks)})")
    tasks = [t for t in meta.tasks if t not in leave_out]
    if len(tasks) < 2:
        raise UserError("a portfolio needs the scores of at least two tasks")
    return tasks


def calibration(meta, tasks: list[str]) -> dict[str, float]:
    """Task -> the rate LoRA's sweep chooses there (simulate.tuned_lora on the design's ladder; the geometric mean
    over the selection seeds): the portfolio's calibration (autopelt/portfolio/portfolio.py). Empty where the
    meta-dataset holds no LoRA ladder."""
    import math

    from metalearning import simulate

    out = {}
    for task in tasks:
        try:
            rates = [simulate.tuned_lora(simulate.Task(meta, task, seed=s)).config.partition("@")[2]
                     for s in meta.selection_seeds]
        except (ValueError, TypeError, AttributeError):  # no ladder (or no reference trial) at some seed
            return {}
        out[task] = float(f"{math.exp(sum(math.log(float(r)) for r in rates) / len(rates)):.3g}")
    return out


SEARCHED_BASELINES = tuple(phases.baselines_for(TimeBudget(3600), with_portfolio=True))  # as a search plans them


def baseline_rates(meta, tasks: list[str]) -> dict[str, float]:
    """Each searched baseline's learned rate, among the design's configurations of its exact structure (its
    preset read by the mean, batch 32, every layer, the design's backbone dropout), over `tasks` and the selection
    seeds: the rate that collapsed at the fewest (task, seed) runs, then the best mean dev.

    A run collapsed when it ended at predicting one class (within `lr_sweep.learned_margin` of the task's
    `floors` in the meta-dataset's header) where another rate of the structure learned: a user trains the answer
    once, and a rate that collapses at some seed or task is not a good rate, however well it does elsewhere
    (docs/portfolio.md). Without floors in the header, the best mean dev."""
    from autopelt.search.baselines import baseline_spec
    from autopelt.train.lr_sweep import learned_margin

    floors = meta.header.get("floors") or {}
    dev_size = (meta.header.get("protocol") or {}).get("dev_size", 1000)
    rates = {}
    for baseline in SEARCHED_BASELINES:
        spec = baseline_spec(baseline, "mean")
        runs = [c for c in meta.candidates() if _is_structure(config_named(c), spec)]
        if not runs:
            continue
        devs = {c: {(t, s): metadata.answer(meta.trial(t, c, s)).dev for t in tasks for s in meta.selection_seeds}
                for c in runs}

        def learned(c: str, key: tuple) -> bool:
            floor = floors.get(key[0])
            return floor is None or devs[c][key] > floor + learned_margin(floor, dev_size)

        def collapses(c: str) -> int:
            return sum(not learned(c, key) and any(learned(o, key) for o in runs) for key in devs[c])

        best = min(runs, key=lambda c: (collapses(c), -sum(devs[c].values())))
        rates[baseline] = config_named(best).learning_rate
    return rates


def _is_structure(config: Config, spec: dict) -> bool:
    return (list(config.methods) == list(spec["methods"]) and config.pooling == spec["pooling"]
            and config.batch_size == 32 and config.layers is None and config.backbone_dropout == "model")


def with_prior(meta_path: str, size: int, out: str, say=print, leave_out: tuple[str, ...] = ()) -> dict:
    """The shipped portfolio file: the global portfolio over every task (what a search runs without meta-features,
    and for a task unlike all of them), its baselines' rates, and the task-aware prior with k chosen by
    leave-one-task-out over every task (metalearning/prior.py). With `leave_out`, the same file built as if the
    meta-dataset had never held those tasks (members, rates, calibration, prior and its k): what a live benchmark
    on one of them runs."""
    import dataclasses

    from metalearning import prior

    meta = metadata.shipped() if meta_path == "shipped" else metadata.load(meta_path)
    if leave_out:
        kept = _kept_tasks(meta, leave_out)
        header = dict(meta.header, tasks=kept,
                      features={t: f for t, f in (meta.header.get("features") or {}).items() if t in kept})
        meta = dataclasses.replace(meta, header=header, records=tuple(r for r in meta.records if r["task"] in kept))
    features = prior.features_of(meta)
    k, means = prior.choose_k(meta, features)
    say("leave-one-task-out, test (%) of halving over the task-aware portfolio at 8 equivalents, by k: "
        + ", ".join(f"{key}: {100 * value:.2f}" for key, value in means.items()) + f" -> k = {k}")
    scores = meta.dev_scores(meta.tasks, meta.candidates())
    chosen = select.greedy_portfolio(scores, size)
    built_from = {"meta_dataset": meta_path, "tasks": meta.tasks,
                  "selection": "greedy, mean dev over seeds " + ", ".join(map(str, meta.selection_seeds)),
                  "mean_regret": round(select.mean_regret(scores, chosen), 4),
                  "prior_k_by_loo": {str(key): round(100 * value, 2) for key, value in means.items()}}
    if leave_out:
        built_from["left_out"] = list(leave_out)
    return to_file([config_named(c) for c in chosen], meta.header.get("model"), built_from, out,
                   baseline_rates(meta, meta.tasks), DESIGN_VERSION,
                   extra={"prior": prior.build(meta, features, k).to_dict()}, calibration=calibration(meta, meta.tasks))
