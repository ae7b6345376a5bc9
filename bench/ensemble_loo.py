"""Leave-one-task-out: ensembles of the deltas a search trained, simulated on the meta-dataset's predictions.

For every task of the meta-dataset and budget B (full-trial equivalents), the candidates are the first B
configurations in the order a search trains them on that task: the global portfolio learned greedily from the
other tasks' dev, the mean over the selection seeds (never from the held-out task), every configuration ranked;
what a search of B equivalents would have trained (a simplification: no halving, no sampler). The inner folds that
choose the rule take the design's order. Arms, each chosen on dev and scored on test, once on each seed's trials
(a "world": seed 0, and a later seed where the meta-dataset holds the task's first 8 candidates at it, at the
budgets whose candidates it holds):
  single       the candidate of the best dev (the search's single answer)
  ensemble     greedy selection with replacement (Caruana et al. 2004) with the rule chosen by leave-one-task-out
  answer       the margin rule: the ensemble when its dev gain over the single answer exceeds the chosen margin
  ensemble-k4  the ensemble limited to its 4 heaviest members
  default      the best single default: the configuration of the highest mean dev on the other tasks
  seeds        the equal-cost baseline: the first configuration of that order trained with as many seeds as the
               ensemble has members, averaged, as far as the meta-dataset has seeds (seeds 0-3 on every task: where
               the ensemble has more than 4 members the baseline is short of runs, which flatters the ensemble)
  learned      not an arm of the table: the ensemble with the candidates at the dev floor left out (within
               autopelt/study/floors.py's margin of predicting one class, Floors.learned; all of them when none is
               past it), its gain over the ensemble stated where the floor is known (the meta-dataset's `floors`)
  soup         n/a: the meta-dataset keeps predictions, not weights, and a soup's outputs are not an average of its
               members' outputs (autopelt/ensemble/soup.py); lab/experiments/soup/soup.py measured it on trained deltas
The rule (max size, stop rule, bagging) and the margin are chosen for each held-out task on the other tasks'
dev only: their dev rows split in two halves, the ensemble and the single answer selected on one half and scored
on the other, both ways, at every budget; the rule of the highest mean over tasks and budgets wins. Test is only
reported.

    python bench/ensemble_loo.py [--meta lab/metalearning/data/all-MiniLM-L6-v2.json]
                                 [--predictions lab/metalearning/data/predictions] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np


from autopelt.ensemble.select import Rule, answers, combine, default_metric, limit, select
from autopelt.study.floors import Floors
from results import write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lab"))  # the meta-dataset's pipeline: never installed
BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16)
RULES = tuple(Rule(max_size=size, stop=stop) for size in (4, 8, 16, 32) for stop in ("best", "no_gain")) + (
    Rule(max_size=16, stop="best", bags=8),)
MARGINS = (0.0, 0.0025, 0.005, 0.01, 0.02)
TARGET_BUDGET, TARGET_VS_SINGLE, TARGET_VS_SEEDS, TARGET_WORST_SEED = 8, 0.5, 0.3, 1.0
LIMIT_K = 4
ARMS = ("single", "ensemble", "answer", f"ensemble-k{LIMIT_K}", "default", "seeds")


def order(configs: set[str]) -> list[str]:
    """The design's order, then anything else by name: the order the inner (rule-choosing) folds train in."""
    from metalearning.design import DESIGN

    names = [c.name for c in DESIGN] + sorted(configs)
    return list(dict.fromkeys(name for name in names if name in configs))


def mean_dev(trials_by_seed: dict, config: str, seeds: tuple[int, ...]) -> float | None:
    """A configuration's dev metric on one task, the mean over `seeds`; None where a seed lacks it."""
    trials = [trials_by_seed.get(s, {}).get(config) for s in seeds]
    if any(t is None for t in trials):
        return None
    return float(np.mean([default_metric(t["dev"].ndim == 1)(t["dev"], t["dev_labels"]) for t in trials]))


def held_out_order(data: dict, held_out: str, configs: list[str], seeds: tuple[int, ...] = (0,)) -> list[str]:
    """The order a search trains in on `held_out`: the global portfolio learned greedily from the other tasks'
    dev metrics, the mean over the selection `seeds` (autopelt/portfolio/select.py, as the shipped prior is
    built), every configuration, so the held-out task never orders its own candidates; configurations some other
    task lacks at a selection seed go last."""
    from autopelt.portfolio import select

    others = [t for t in data if t != held_out]
    devs = {t: {c: mean_dev(data[t], c, seeds) for c in configs} for t in others}
    common = [c for c in configs if all(devs[t][c] is not None for t in others)]
    ranked = select.greedy_portfolio({t: {c: devs[t][c] for c in common} for t in others}, len(common))
    return ranked + [c for c in configs if c not in ranked]


def load(meta: Path, predictions: Path) -> dict:
    """{task: {seed: {config: {"dev", "test", "dev_labels", "test_labels"}}}} of every ok trial with predictions."""
    from autopelt.train.predictions import dense

    from metalearning import metadata

    data: dict = {}
    for record in metadata.load(meta).records:
        if record.get("status") != "ok":
            continue
        path = predictions / record["task"] / f"{record['config']}@s{record['seed']}.npz"
        if not path.is_file():
            continue
        with np.load(path) as raw:
            arrays = {name: raw[name] for name in raw.files}
        data.setdefault(record["task"], {}).setdefault(record["seed"], {})[record["config"]] = {
            "dev": dense(arrays, "dev"), "test": dense(arrays, "test"),
            "dev_labels": arrays["dev_labels"], "test_labels": arrays["test_labels"]}
    return data


def halves(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed split of the dev rows in two halves."""
    permutation = np.random.default_rng(seed).permutation(rows)
    return np.sort(permutation[: rows // 2]), np.sort(permutation[rows // 2:])


def inner_scores(trials: dict, names: list[str]) -> np.ndarray:
    """(rules, margins) mean score on the other dev half of the margin-rule answer fitted on one half, both ways."""
    labels = trials[names[0]]["dev_labels"]
    regression = trials[names[0]]["dev"].ndim == 1
    metric = default_metric(regression)
    out = np.zeros((len(RULES), len(MARGINS)))
    for fit, score in (halves(len(labels)), halves(len(labels))[::-1]):
        fitted = [trials[n]["dev"][fit] for n in names]
        scored = [trials[n]["dev"][score] for n in names]
        for r, rule in enumerate(RULES):
            chosen = select(fitted, labels[fit], rule, regression)
            ensemble = metric(combine(scored, chosen.weights), labels[score])
            single = metric(scored[chosen.single], labels[score])
            for m, margin in enumerate(MARGINS):
                out[r, m] += (ensemble if answers(chosen, margin) else single) / 2
    return out


def outer(trials: dict, names: list[str], rule: Rule, margin: float, seeds_test: list[np.ndarray],
          floor: float | None = None) -> dict:
    """One world's arms on its task: selected on the whole dev set, scored on test (in points); with the task's
    dev `floor`, also the ensemble of the candidates past it ("learned", None without a floor)."""
    first = trials[names[0]]
    regression = first["dev"].ndim == 1
    metric = default_metric(regression)
    devs, tests = [trials[n]["dev"] for n in names], [trials[n]["test"] for n in names]
    chosen = select(devs, first["dev_labels"], rule, regression)
    small = limit(chosen, devs, first["dev_labels"], LIMIT_K, regression)
    ensemble = metric(combine(tests, chosen.weights), first["test_labels"])
    single = metric(tests[chosen.single], first["test_labels"])
    members = len(chosen.members)
    seeds = seeds_test[:members]
    learned, dropped = (None if floor is None else ensemble), 0
    if floor is not None:
        labels = first["dev_labels"]
        floors = Floors(dev=floor, test=None, dev_rows=len(labels), metric="")
        past = [i for i, dev in enumerate(devs) if floors.learned(metric(dev, labels))] or list(range(len(devs)))
        dropped = len(devs) - len(past)
        if dropped:
            kept = select([devs[i] for i in past], labels, rule, regression)
            learned = metric(combine([tests[i] for i in past], kept.weights), first["test_labels"])
    return {"single": 100 * single, "ensemble": 100 * ensemble,
            "answer": 100 * (ensemble if answers(chosen, margin) else single),
            f"ensemble-k{LIMIT_K}": 100 * metric(combine(tests, small.weights), first["test_labels"]),
            "seeds": 100 * metric(combine(seeds, [1 / len(seeds)] * len(seeds)), first["test_labels"]),
            "members": members, "seed_members": len(seeds), "dev_gain": 100 * chosen.gain,
            "answered": answers(chosen, margin), "learned": None if learned is None else 100 * learned,
            "floor_dropped": dropped}


def best_default(data: dict, held_out: str, configs: list[str], seeds: tuple[int, ...] = (0,)) -> str:
    """The configuration of the highest mean dev over the other tasks and the selection `seeds` (of those every
    other task has at every selection seed)."""
    others = [t for t in data if t != held_out]
    def mean_over_tasks(name):
        values = [mean_dev(data[task], name, seeds) for task in others]
        return -np.inf if any(v is None for v in values) else float(np.mean(values))
    return max(configs, key=mean_over_tasks)


def worlds(trials_by_seed: dict, ranked: list[str]) -> list[int]:
    """A task's seeds that are worlds: seed 0, and each seed holding the first TARGET_BUDGET candidates of the
    task's order `ranked` (it counts at the budgets whose candidates it holds). A seed run for the first
    configuration alone (more seeds for the equal-cost baseline) only widens the seed ensemble."""
    first = ranked[:TARGET_BUDGET]
    return [s for s in sorted(trials_by_seed) if s == 0 or all(c in trials_by_seed[s] for c in first)]


def run(data: dict, budgets=BUDGETS, echo=print, floors: dict | None = None, seeds: tuple[int, ...] = (0,)) -> dict:
    """Every task's arms at every budget, with the rule and margin chosen without it; and the summary. `floors`:
    {task: dev metric of predicting one class} (the meta-dataset's), for the "learned" ensemble. `seeds`: the
    selection seeds (the meta-dataset's), which order the candidates, pick the best default and (their mean)
    choose the rule."""
    configs = order({c for task in data.values() for seed in task.values() for c in seed})
    inner: dict = {}  # (task, budget) -> (rules, margins) inner dev scores, the mean over the selection seeds
    for task in data:
        for budget in budgets:
            names = configs[:budget]
            if len(names) == budget and all(c in data[task].get(s, {}) for s in seeds for c in names):
                inner[task, budget] = np.mean([inner_scores(data[task][s], names) for s in seeds], axis=0)
    rows, choices = [], {}
    for task in sorted(data):
        others = [key for key in inner if key[0] != task]
        table = np.mean([inner[key] for key in others], axis=0)
        r, m = np.unravel_index(int(np.argmax(table)), table.shape)  # first of ties: the smaller rule and margin
        rule, margin = RULES[r], MARGINS[m]
        choices[task] = {"rule": rule.to_dict(), "margin": margin}
        default = best_default(data, task, configs, seeds)
        ranked = held_out_order(data, task, configs, seeds)
        first = ranked[0]
        for seed in worlds(data[task], ranked):
            trials = data[task][seed]
            seed_order = [s for s in [seed] + sorted(data[task]) if s in data[task] and first in data[task][s]]
            seeds_test = [data[task][s][first]["test"] for s in dict.fromkeys(seed_order)]
            for budget in budgets:
                names = ranked[:budget]
                if len(names) < budget or any(n not in trials for n in names) or not seeds_test:
                    continue
                arms = outer(trials, names, rule, margin, seeds_test, (floors or {}).get(task))
                labels, regression = trials[names[0]]["test_labels"], trials[names[0]]["test"].ndim == 1
                arms["default"] = (100 * default_metric(regression)(trials[default]["test"], labels)
                                   if default in trials else None)
                rows.append({"task": task, "seed": seed, "budget": budget, **arms, "soup": "n/a"})
        echo(f"{task}: rule {rule.to_dict()} margin {margin}")
    return {"rows": rows, "choices": choices, "summary": summarise(rows, budgets), "configs": configs}


def summarise(rows: list[dict], budgets) -> list[dict]:
    """Per budget: each arm's mean over tasks (seed 0 world, and the mean over available worlds), the worst seed."""
    out = []
    for budget in budgets:
        at = [r for r in rows if r["budget"] == budget]
        if not at:
            continue
        tasks = sorted({r["task"] for r in at})
        line = {"budget": budget, "tasks": len(tasks)}
        for arm in ARMS:
            per_task = [[r[arm] for r in at if r["task"] == t and r[arm] is not None] for t in tasks]
            per_task = [values for values in per_task if values]
            line[arm] = statistics.fmean(statistics.fmean(v) for v in per_task)
            line[f"{arm}_worst"] = statistics.fmean(min(v) for v in per_task)
        several = [t for t in tasks if len([r for r in at if r["task"] == t]) > 1]  # tasks with 2+ worlds
        line["two_seed_tasks"] = len(several)
        for arm in ("ensemble", "answer"):  # how far a task's worst world falls below its mean, where it has 2+
            gaps = [statistics.fmean(v) - min(v) for v in ([r[arm] for r in at if r["task"] == t] for t in several)]
            line[f"{arm}_worst_gap"] = statistics.fmean(gaps) if gaps else None
        line["members"] = statistics.fmean(r["members"] for r in at)
        line["seed_members"] = statistics.fmean(r["seed_members"] for r in at)
        line["answered"] = sum(r["answered"] for r in at) / len(at)
        with_floor = [r for r in at if r.get("learned") is not None]
        if with_floor:  # the floor rule against the ensemble, over every world (zero where it drops nothing)
            line["learned_gain"] = statistics.fmean(r["learned"] - r["ensemble"] for r in with_floor)
            line["learned_worlds"] = len(with_floor)
            line["learned_changed"] = {f"{r['task']}@s{r['seed']}": round(r["learned"] - r["ensemble"], 2)
                                       for r in with_floor if r["floor_dropped"]}
        out.append(line)
    return out


def verdict(summary: list[dict]) -> list[str]:
    line = next((s for s in summary if s["budget"] == TARGET_BUDGET), None)
    if line is None:
        return [f"no rows at {TARGET_BUDGET} equivalents"]
    checks = []
    for arm in ("ensemble", "answer"):
        vs_single, vs_seeds = line[arm] - line["single"], line[arm] - line["seeds"]
        gap = line[f"{arm}_worst_gap"]
        worst = ("worst seed not measured (no task has two worlds: seeds holding half its configurations)"
                 if gap is None else f"worst seed {gap:.2f} below its mean (target ≤ {TARGET_WORST_SEED}: "
                 f"{'met' if gap <= TARGET_WORST_SEED else 'missed'}; over the {line['two_seed_tasks']} tasks with "
                 "two seeds)")
        checks.append(f"{arm} at {TARGET_BUDGET}: {vs_single:+.2f} over the single answer "
                      f"(target ≥ +{TARGET_VS_SINGLE}: "
                      f"{'met' if vs_single >= TARGET_VS_SINGLE else 'missed'}), {vs_seeds:+.2f} over the seed "
                      f"ensemble of {line['seed_members']:.1f} runs (target ≥ +{TARGET_VS_SEEDS}: "
                      f"{'met' if vs_seeds >= TARGET_VS_SEEDS else 'missed'}), {worst}")
    if "learned_gain" in line:
        changed = line["learned_changed"]
        checks.append(f"candidates at the dev floor left out, at {TARGET_BUDGET}: {line['learned_gain']:+.2f} over "
                      f"the ensemble on the mean of {line['learned_worlds']} worlds; it changes "
                      + (", ".join(f"{world} {gain:+.2f}" for world, gain in changed.items()) if changed else "none"))
    return checks


def table(summary: list[dict]) -> str:
    head = "budget  tasks " + " ".join(f"{arm:>12}" for arm in ARMS) + "  members seed runs answered"
    lines = [head]
    for s in summary:
        lines.append(f"{s['budget']:>6} {s['tasks']:>6} " + " ".join(f"{s[arm]:>12.2f}" for arm in ARMS)
                     + f"  {s['members']:>7.1f} {s['seed_members']:>9.1f} {100 * s['answered']:>7.0f}%")
    return "\n".join(lines) + "\nsoup: n/a (the meta-dataset keeps predictions, not weights)"


def training_precision(meta: Path) -> str:
    """How the meta-dataset's trials trained, from its header's hardware (the simulation itself runs here)."""
    from metalearning import metadata

    hardware = metadata.load(meta).header.get("hardware") or {}
    parts = [f"{hardware['precision']} training ({hardware.get('name', '?')})"] if hardware.get("precision") else []
    cpu = hardware.get("cpu") or {}
    if cpu.get("precision"):
        parts.append(f"{cpu['precision']} on {cpu.get('name', 'a CPU')} for the CPU trials its header lists")
    return "; ".join(parts or ["training precision not recorded"]) + "; float16 stored predictions"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta", default=str(ROOT / "lab/metalearning/data/all-MiniLM-L6-v2.json"))
    parser.add_argument("--predictions", default=str(ROOT / "lab/metalearning/data/predictions"))
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--name", default="ensemble-loo")
    args = parser.parse_args(argv)
    started = time.time()
    data = load(Path(args.meta), Path(args.predictions))
    if len(data) < 2:
        print(f"ensemble_loo: {args.meta} holds fewer than 2 tasks with predictions", file=sys.stderr)
        return 2
    from metalearning import metadata

    meta = metadata.load(Path(args.meta))
    result = run(data, floors=meta.header.get("floors"), seeds=meta.selection_seeds)
    print(table(result["summary"]))
    checks = verdict(result["summary"])
    print("\n".join(checks))
    seeds = {task: sorted(data[task]) for task in data}
    path = write_results(args.name, result["summary"],
                         columns=["budget", "tasks", *ARMS, "members", "seed_members", "answered"],
                         precision=training_precision(Path(args.meta)), out_dir=args.out,
                         settings={"meta": args.meta, "predictions": args.predictions, "budgets": list(BUDGETS),
                                   "rules": [r.to_dict() for r in RULES], "margins": list(MARGINS),
                                   "order": result["configs"], "seeds_per_task": seeds,
                                   "selection_seeds": list(meta.selection_seeds),
                                   "choices": result["choices"], "per_task": result["rows"],
                                   "seconds": round(time.time() - started, 1)},
                         notes="; ".join(checks) + "; soup n/a (predictions only)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
