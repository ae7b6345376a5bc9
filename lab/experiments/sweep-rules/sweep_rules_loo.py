"""Leave-one-task-out judgement of the learning-rate sweep's special cases (autopelt/train/lr_sweep.py).

The sweep ranks candidate rates by their first dev evaluation (epoch 1 of 3) and lets the best train on; its
special cases (`lr_sweep.RULES`) were each chosen from runs on SST-2 and SNLI. Here they are judged on all twelve
tasks of the portfolio's meta-dataset, where ten were never looked at when the rules were made.

`collect` trains one baseline (`--method`: LoRA r8 on query and value, prefix-tuning of length 10, or UniPELT(APL);
read by the mean, batch 32, backbone dropout off, as a default search trains it) at every rate of a grid that
holds the sweep's ladder and the midpoints it tries, on each
task's pool (K=1000, dev 1,000, 3 epochs, seed 0), recording per epoch dev metric, dev loss and test metric: the
meta-dataset's protocol and record (metalearning/collect.py), resumable. A sweep's candidate trains from the
same initial state on the same batches as a whole trial at its rate, so its first evaluation is that trial's first
epoch, and the winner's run is that trial: `judge` replays the real sweep (`lr_sweep._Sweep`'s decisions) on the
recorded evaluations, with all rules and without each, and scores the chosen rate's kept state (its best dev epoch)
on test. A replay that asks for a rate outside the grid is counted and left out of that arm's mean.

Arms besides the sweeps: the rate with the best mean dev over the other eleven tasks (a fixed rate learned
leave-one-task-out), the grid's best rate by final dev on the task itself (every rate trained: the sweep's
reference), and any rate given with `--fixed` (a rate learned elsewhere, e.g. the portfolio's for UniPELT).
Printed and written (`sweep-rules-loo`): per arm the mean test over the twelve tasks and over the ten the rules
were not chosen on, the paired change against all rules, the candidates trained, and per task the rates.

    python lab/experiments/sweep-rules/sweep_rules_loo.py collect --pool POOL --out experiments/sweep-rules/sweep-ladder/lora.jsonl --workers 2
    python lab/experiments/sweep-rules/sweep_rules_loo.py judge --pool POOL --ladder experiments/sweep-rules/sweep-ladder/lora.jsonl
    python lab/experiments/sweep-rules/sweep_rules_loo.py collect --method prefix --pool POOL --out experiments/sweep-rules/sweep-ladder/prefix.jsonl
    python lab/experiments/sweep-rules/sweep_rules_loo.py judge --pool POOL --ladder experiments/sweep-rules/sweep-ladder/prefix.jsonl
    python lab/experiments/sweep-rules/sweep_rules_loo.py judge --pool POOL --ladder experiments/sweep-rules/sweep-ladder/lora-21.jsonl --name sweep-rules-loo-21
    python lab/experiments/sweep-rules/sweep_rules_loo.py collect --method unipelt_apl --pool POOL --out experiments/sweep-rules/sweep-ladder/unipelt_apl.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import types
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"
CHOSEN_ON = ("sst2", "snli")  # the tasks the rules were chosen on (docs/learning-rates.md)
# the ladder's rungs and the midpoints the sweep tries, most often needed first (a cut-short collection is usable)
GRID = (1e-3, 3e-3, 1e-2, 3e-4, 3e-2, 5.5e-3, 1.7e-3, 5.5e-4, 1e-4, 1.7e-2, 1.7e-4, 3e-5)
# the baselines a ladder can be collected for: their names in the ladder file and what the results say they are
METHODS = {
    "lora": ("sweep-lora-r8-qv", "LoRA r8 (query, value), mean pooling, batch 32, backbone dropout off"),
    "prefix": ("sweep-prefix-l10", "prefix-tuning, length 10, mean pooling, batch 32, backbone dropout off"),
    "unipelt_apl": ("sweep-unipelt-apl", "UniPELT(APL): gated adapter, prefix and LoRA, mean pooling, batch 32, "
                    "backbone dropout off"),
}
MODEL = None  # autopelt's default model (all-MiniLM-L6-v2), as the meta-dataset


class Missing(Exception):
    """The replay asked for a rate the grid does not hold."""


def config_name(rate: float, method: str = "lora") -> str:
    return f"{METHODS[method][0]}-{rate:g}"


def rate_of(config: str, method: str) -> float:
    """The rate in a ladder configuration's name (`config_name`'s inverse: 3e-05 has a hyphen of its own)."""
    prefix = METHODS[method][0] + "-"
    if not config.startswith(prefix):
        raise SystemExit(f"{config!r} is not a {method} ladder configuration ({prefix}<rate>)")
    return float(config[len(prefix):])


def method_of(ladder: list[dict]) -> str:
    """The baseline a collected ladder trained (one per file)."""
    names = {name for name, (prefix, _) in METHODS.items() for record in ladder
             if record["config"].startswith(prefix + "-")}
    if len(names) != 1:
        raise SystemExit(f"a ladder file holds one baseline of {sorted(METHODS)}; this one holds {sorted(names)}")
    return names.pop()


def configs(method: str = "lora", rates: tuple[float, ...] = GRID) -> dict:
    from metalearning.design import Config
    from autopelt.search.baselines import baseline_spec

    spec = baseline_spec(method, "mean")
    return {config_name(rate, method): Config(config_name(rate, method), tuple(spec["methods"]), rate,
                                              pooling=spec["pooling"], backbone_dropout="off") for rate in rates}


def collect(args) -> None:
    from autopelt.models import resolve_model
    from metalearning import collect as collector
    from metalearning.tasks import read_pool

    tasks = args.tasks.split(",") if args.tasks else list(read_pool(args.pool))
    rates = [float(r) for r in args.rates.split(",") if r.strip()] if args.rates else GRID
    jobs = [collector.Job(task, config_name(rate, args.method), 0) for rate in rates for task in tasks]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    collector.collect(jobs, args.out, args.pool, resolve_model(args.model), workers=args.workers,
                      threads=args.threads, configs=configs(args.method, tuple(rates)))


def task_info(pool: str, name: str) -> types.SimpleNamespace:
    """What the sweep compares with on this task's dev rows (as a trial of the meta-dataset splits them)."""
    from metalearning.tasks import dev_rows
    from autopelt.train.lr_sweep import one_class_metric

    task, labels = dev_rows(pool, name)
    data = types.SimpleNamespace(task=task, dev=types.SimpleNamespace(labels=labels))
    return types.SimpleNamespace(floor=one_class_metric(data), rows=len(labels))


def replay(records: dict[float, dict], info, rules: frozenset) -> tuple[float, int]:
    """(the rate the sweep with `rules` goes on with, candidates it trained) on the recorded evaluations."""
    from autopelt.train import lr_sweep

    class Replay(lr_sweep._Sweep):
        def __init__(self):  # noqa: super().__init__ trains; the replay reads
            self.plan = lr_sweep.SweepPlan(lr_sweep.START, lr_sweep.MAX_CANDIDATES, rules,
                                           lr_sweep.CLASSIFICATION.recorded)
            self.rules = rules
            self.tried, self.steps_done = {}, 0
            self._start(info.floor, info.rows)

        def _try(self, rate: float) -> None:
            record = records.get(rate)
            if record is None:
                raise Missing(rate)
            history = [{"dev_metric": e["dev"], "dev_loss": e["dev_loss"]} for e in record["epochs"]]
            if record["status"] != "ok" or not history:
                history = [{"dev_metric": None, "dev_loss": None}]
            run = types.SimpleNamespace(outcome=types.SimpleNamespace(history=history), done=False)
            self.tried[rate] = (run, None, 0.0)

    sweep = Replay()
    sweep._explore()  # lr_sweep._Sweep.run, its decisions only
    if not any(sweep._finite(rate) for rate in sweep.tried):
        return math.nan, len(sweep.tried)
    second = [rate for rate in sweep._second_pair() if len(sweep.tried[rate][0].outcome.history) >= 2]
    rate, _ = sweep._choose(second)
    return rate, len(sweep.tried)


def kept(record: dict) -> dict:
    """The epoch a trial keeps (its best dev; the first of equals), as recorded."""
    epochs = [e for e in record["epochs"] if e["dev"] is not None]
    return max(epochs, key=lambda e: e["dev"]) if epochs else {"dev": math.nan, "test": math.nan}


def judge(args) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from results import write_results

    from autopelt.train.lr_sweep import RULES

    ladder = [json.loads(line) for line in Path(args.ladder).read_text().splitlines() if line.strip()]
    method = method_of(ladder)
    by_task: dict[str, dict[float, dict]] = {}
    for record in ladder:
        rate = rate_of(record["config"], method)
        by_task.setdefault(record["task"], {})[rate] = record
    tasks = sorted(by_task)
    arms = {"all rules": RULES, **{f"without {rule}": RULES - {rule} for rule in sorted(RULES)},
            "no special case": frozenset()}
    picks: dict[str, dict[str, tuple]] = {arm: {} for arm in arms}
    infos = {task: task_info(args.pool, task) for task in tasks}
    for task in tasks:
        for arm, rules in arms.items():
            try:
                rate, tried = replay(by_task[task], infos[task], rules)
            except Missing as missing:
                picks[arm][task] = (None, None, f"needs {missing.args[0]:g}")
                continue
            test = kept(by_task[task][rate])["test"] if rate == rate else math.nan
            picks[arm][task] = (rate, test, tried)
    for rate in args.fixed or ():  # a rate chosen elsewhere (e.g. the portfolio's learned rate for this baseline)
        given = picks[f"fixed {rate:g} (given)"] = {}
        for task in tasks:
            on_grid = rate in by_task[task]
            given[task] = (rate, kept(by_task[task][rate])["test"], 1) if on_grid else (None, None, f"needs {rate:g}")
    fixed, oracle = "fixed rate, learned on the other tasks", "best rate by final dev (every rate trained)"
    picks[fixed], picks[oracle] = {}, {}
    for task in tasks:
        others = [t for t in tasks if t != task]
        common = set.intersection(*(set(by_task[t]) for t in others))
        rate = max(sorted(common), key=lambda r: statistics.fmean(kept(by_task[t][r])["dev"] for t in others))
        picks[fixed][task] = (rate, kept(by_task[task][rate])["test"], 1) if rate in by_task[task] else \
            (None, None, f"needs {rate:g}")
        best = max(sorted(by_task[task]), key=lambda r: kept(by_task[task][r])["dev"])
        picks[oracle][task] = (best, kept(by_task[task][best])["test"], len(by_task[task]))

    def scored(pick: tuple) -> bool:
        return isinstance(pick[1], float) and pick[1] == pick[1]

    common = [t for t in tasks if all(scored(chosen[t]) for chosen in picks.values())]  # every arm has an answer
    unseen = [t for t in common if t not in CHOSEN_ON]
    reference = picks["all rules"]
    rows = []
    for arm, chosen in picks.items():
        paired = {t: 100 * (chosen[t][1] - reference[t][1]) for t in tasks  # each arm against all rules on the
                  if t not in CHOSEN_ON and scored(chosen[t]) and scored(reference[t])}  # unseen tasks both answer
        tried = [chosen[t][2] for t in common if isinstance(chosen[t][2], int)]
        rows.append({
            "arm": arm, "tasks": len(common),
            "outside_grid": sum(not scored(chosen[t]) for t in tasks),
            "test_mean": round(100 * statistics.fmean(chosen[t][1] for t in common), 2) if common else None,
            "test_mean_unseen": round(100 * statistics.fmean(chosen[t][1] for t in unseen), 2) if unseen else None,
            "paired_unseen_tasks": len(paired),
            "delta_unseen_vs_all_rules": round(statistics.fmean(paired.values()), 2) if paired else None,
            "unseen_worse_by_1pt": sum(d < -1.0 for d in paired.values()),
            "unseen_better_by_1pt": sum(d > 1.0 for d in paired.values()),
            "candidates_mean": round(statistics.fmean(tried), 2) if tried else None,
            "rates": {t: (f"{chosen[t][0]:g}" if chosen[t][0] else chosen[t][2]) for t in tasks},
        })
    columns = ["arm", "tasks", "outside_grid", "test_mean", "test_mean_unseen", "paired_unseen_tasks",
               "delta_unseen_vs_all_rules",
               "unseen_worse_by_1pt", "unseen_better_by_1pt", "candidates_mean"]
    print(f"| {' | '.join(columns)} |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join("–" if row[c] is None else str(row[c]) for c in columns) + " |")
    print()
    print("| task | " + " | ".join(row["arm"] for row in rows[:1] + rows[-2:]) + " | grid rates |")
    for task in tasks:
        print(f"| {task} | " + " | ".join(str(row["rates"][task]) for row in rows[:1] + rows[-2:])
              + f" | {len(by_task[task])} |")
    grid = sorted({rate for rates in by_task.values() for rate in rates})
    write_results(args.name or "sweep-rules-loo" + ("" if method == "lora" else f"-{method}"), rows, columns,
                  out_dir=Path(__file__).parent, settings={
        "ladder": str(args.ladder), "tasks": tasks, "chosen_on": list(CHOSEN_ON), "grid": grid,
        "delta": METHODS[method][1], "seed": 0},
        notes="test in points; means over the tasks where every arm has an answer (a replay that needs a rate "
              "outside the grid has none); delta: paired against all rules on the unseen tasks (all but sst2 and "
              "snli) where both answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("collect", help="train a baseline at every rate of the grid on every task")
    run.add_argument("--method", choices=sorted(METHODS), default="lora")
    run.add_argument("--pool", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--model", default=MODEL)
    run.add_argument("--tasks", help="comma-separated (default: every task of the pool)")
    run.add_argument("--rates", help="comma-separated rates to add (default: the grid); e.g. a rate a replay needs")
    run.add_argument("--workers", type=int, default=1)
    run.add_argument("--threads", type=int, default=1)
    replayed = sub.add_parser("judge", help="replay the sweep with and without each rule on the collected grid")
    replayed.add_argument("--pool", required=True)
    replayed.add_argument("--ladder", required=True)
    replayed.add_argument("--name", help="the results' name (default sweep-rules-loo[-METHOD])")
    replayed.add_argument("--fixed", type=float, action="append",
                          help="also score this rate on every task (repeatable), e.g. a portfolio's learned rate")
    args = parser.parse_args()
    collect(args) if args.command == "collect" else judge(args)


if __name__ == "__main__":
    main()
