"""Leave-one-task-out: the prior built without a task, against the other strategies, simulated on that task.

For each of the meta-dataset's tasks, two portfolios are built from the other tasks' dev scores
(autopelt/portfolio/select.py): the global one (every other task) and the task-aware one (the k other tasks nearest
in meta-feature space, autopelt/portfolio/prior.py, k chosen by a leave-one-task-out over the other tasks alone,
lab/metalearning/prior.py: the held-out task never chooses its own k). Every strategy is simulated on the held-out
task at budgets of 1, 2, 4, 8 and 16 full-trial equivalents (lab/metalearning/simulate.py), on each seed's trials:
selection by dev only, the answer scored on test. Each arm's mean over seeds is reported, and its worst seed.

Strategies: task-aware (successive halving over the task-aware portfolio), task-aware + sampler (half the budget
to it, the rest drawn from the design: autopelt's default), global and global + sampler (the same with the global
portfolio), random (uniform draws from the design, each trained to full fidelity), random with halving (the same
draws through successive halving, as a random search with ASHA runs them), tuned LoRA (LoRA r8 on query/value, its
rate chosen as the live sweep chooses it on the design's ladder: simulate.tuned_lora), UniPELT(APL) alone (1e-3,
then 3e-3), the best single default (the global portfolio's first configuration), and a control: the global
portfolio code on a matrix whose configuration labels are shuffled within every task, which must do no better
than random with halving.

Two references are reported beside the arms, per task: every candidate trained and the best dev answering, and the
configuration with the best test metric at one seed scored at the other (where two seeds exist).
Tables per task and per kind (binary, few-class, many-class, long, pair, regression).

    python bench/portfolio_loo.py [--meta FILE] [--size 16] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))  # the meta-dataset's pipeline: never installed

from autopelt.portfolio import select  # noqa: E402
from autopelt.study.answers import MARGIN_SE  # noqa: E402
from metalearning import metadata, prior, simulate  # noqa: E402
from results import NAME, write_results  # noqa: E402

BUDGETS = (1, 2, 4, 8, 16)
ARMS = ("task-aware", "task-aware+sampler", "global", "global+sampler", "random", "random+halving", "tuned-lora",
        "unipelt-apl", "best-single", "shuffled-control")
KINDS = ("binary", "few-class", "many-class", "long", "pair", "regression")
LIMITS = ("every by dev", "by test, other seed")
DRAWS, PERMUTATIONS = 400, 200  # at 20 permutations the control read +0.32 over random from noise alone
TARGET_VS_LORA, TARGET_VS_SINGLE, TARGET_VS_ORACLE, TARGET_BUDGET = 1.0, 0.5, 1.0, 8
CONTROL_TOLERANCE = 0.3  # points above its null that the control may score and still count as no better


def shuffled(scores: dict, rng: random.Random) -> dict:
    out = {}
    for task, row in scores.items():
        values = list(row.values())
        rng.shuffle(values)
        out[task] = dict(zip(row, values))
    return out


def kind(features) -> str:
    """A task's kind, the first that fits: regression, long (>= 200 tokens a row), pair, many-class (>= 20),
    few-class (3-19), binary."""
    if features.regression:
        return "regression"
    if features.mean_tokens >= 200:
        return "long"
    if features.pair:
        return "pair"
    return "many-class" if features.classes >= 20 else "few-class" if features.classes >= 3 else "binary"


def held_out(meta, features, task: str, configs: list[str], size: int, margin: float = MARGIN_SE) -> dict:
    """Every arm's test metric (%) at every budget on `task`, with both portfolios built without it: the mean over
    the seeds collected for the task (each a training run of the held-out task) and the worst of them."""
    others = [t for t in meta.tasks if t != task]
    scores = meta.dev_scores(others, configs)  # the held-out task's rows are never read here
    portfolio = select.greedy_portfolio(scores, size)
    k = prior.nested_k(meta, features, task)
    aware = [m.name for m in prior.build(meta, features, k, others).portfolio(features[task], size)[0]]
    rng = random.Random(0)
    controls = [select.greedy_portfolio(shuffled(scores, rng), size) for _ in range(PERMUTATIONS)]
    seeds = prior.task_seeds(meta, task, configs)
    runs = [one_seed(simulate.Task(meta, task, seed=seed, margin=margin), aware, portfolio, controls, configs)
            for seed in seeds]
    pairs = [(a, b) for a in seeds for b in seeds if a != b]
    other = [100 * simulate.by_test_at_other_seed(meta, task, configs, pair) for pair in pairs]
    return {"portfolio": portfolio, "task_aware": aware, "k": k, "kind": kind(features[task]), "seeds": list(seeds),
            "oracle": statistics.mean(run["oracle"] for run in runs),
            "limits": {"every by dev": statistics.mean(run["every by dev"] for run in runs),
                       "by test, other seed": statistics.mean(other) if other else math.nan},
            "arms": {b: {a: statistics.mean(run[b][a] for run in runs) for a in ARMS} for b in BUDGETS},
            "worst": {b: {a: min(run[b][a] for run in runs) for a in ARMS} for b in BUDGETS}}


def one_seed(sim, aware: list[str], portfolio: list[str], controls: list[list[str]], configs: list[str]) -> dict:
    """Every arm's test metric (%) at every budget on one seed's trials of the held-out task."""
    out = {"oracle": 100 * sim.oracle(configs),
           "every by dev": 100 * sim.at(max(configs, key=lambda c: sim.at(c).dev)).test}
    lora = simulate.tuned_lora(sim).test
    for budget in BUDGETS:
        arms = {
            "task-aware": sim.halving(aware, budget, favourite=True).test,
            "task-aware+sampler": statistics.mean(
                simulate.portfolio_then_random(sim, aware, configs, budget, random.Random(d)).test
                for d in range(DRAWS)),
            "global": sim.halving(portfolio, budget, favourite=True).test,
            "global+sampler": statistics.mean(
                simulate.portfolio_then_random(sim, portfolio, configs, budget, random.Random(d)).test
                for d in range(DRAWS)),
            "random": simulate.random_search(sim, configs, budget, DRAWS, seed=1),
            "random+halving": simulate.random_search(sim, configs, budget, DRAWS, seed=1, halving=True),
            "tuned-lora": lora,
            "unipelt-apl": sim.full(list(simulate.UNIPELT), budget).test,
            "best-single": sim.full(portfolio[:1], budget).test,
            "shuffled-control": statistics.mean(sim.halving(c, budget, favourite=True).test for c in controls),
        }
        out[budget] = {arm: 100 * value for arm, value in arms.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta", help="meta-dataset file (default: the shipped one)")
    parser.add_argument("--size", type=int, default=16, help="portfolio size")
    parser.add_argument("--margin", type=float, default=MARGIN_SE,
                        help="a portfolio's first configuration answers unless the best other beats its dev by this "
                             f"many standard errors (default {MARGIN_SE:g}: the search's rule, "
                             "autopelt/study/answers.py; 0: the best dev answers)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                        help="folds simulated at once, one process each (default: the CPUs)")
    parser.add_argument("--json", help="also write every fold's results here")
    parser.add_argument("--name", help="results name under benchmarks/results (default: portfolio-loo, with "
                                       "-margin<M> for a margin)")
    args = parser.parse_args()
    if args.name and not NAME.match(args.name):  # refused now, not after the simulation
        parser.error(f"--name {args.name!r}: use lower-case letters, digits, '.', '_' and '-'")
    meta = metadata.load(args.meta) if args.meta else metadata.shipped()
    configs = meta.candidates()
    features = prior.features_of(meta)
    started = time.time()
    results = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:  # each fold seeds its own draws: the same at any --jobs
        folds = {task: pool.submit(held_out, meta, features, task, configs, args.size, args.margin)
                 for task in meta.tasks}
        for task, fold in folds.items():
            results[task] = fold.result()
            print(f"{task}: k {results[task]['k']}, {time.time() - started:.0f} s", file=sys.stderr)
    report(meta, results, configs)
    print(f"\n({len(meta.tasks)} folds, {len(configs)} configurations, {time.time() - started:.1f} s)")
    rows = [{"strategy": arm, **{str(b): f"{summarise(results, b)['mean'][arm]:.2f}" for b in BUDGETS},
             "worst seed at 8": f"{summarise(results, TARGET_BUDGET)['worst'][arm]:.2f}"} for arm in ARMS]
    seeds = ", ".join(map(str, meta.selection_seeds))
    hw = meta.header.get("hardware", {})
    name_ = args.name or ("portfolio-loo" + (f"-margin{args.margin:g}" if args.margin != MARGIN_SE else ""))
    write_results(name_, rows, columns=["strategy", *map(str, BUDGETS), "worst seed at 8"], precision="bf16",
                  settings={"tasks": meta.tasks, "configurations": len(configs), "portfolio_size": args.size,
                            "margin": args.margin, "k": meta.header["protocol"]["k"], "seeds": meta.selection_seeds,
                            "epochs": meta.header["protocol"]["epochs"], "model": meta.header.get("model")},
                  notes=f"Mean test metric (%) over the {len(meta.tasks)} held-out tasks at 1-16 full-trial "
                        f"equivalents, each task the mean of its seeds that hold every configuration (two on "
                        f"{sum(len(r['seeds']) > 1 for r in results.values())}); worst seed: the mean over tasks of "
                        f"each task's worse seed at {TARGET_BUDGET}. The portfolios learn from seeds {seeds}. The "
                        f"trials ran on {hw.get('name')} and a CPU (the meta-dataset's header), the simulation here.")

    def cells(r: dict, digits: int) -> dict:
        raw = {"oracle": r["oracle"], **r["limits"], **r["arms"][TARGET_BUDGET]}
        return {key: f"{value:.{digits}f}" for key, value in raw.items()}

    per_task = [{"task": task, "kind": r["kind"], "k": str(r["k"]), **cells(r, 1)} for task, r in results.items()]
    mean = {"oracle": statistics.mean(r["oracle"] for r in results.values()),
            "limits": {k: statistics.mean([r["limits"][k] for r in with_limit(results, k)] or [math.nan])
                       for k in LIMITS},
            "arms": {TARGET_BUDGET: summarise(results, TARGET_BUDGET)["mean"]}}
    per_task.append({"task": "mean", **cells(mean, 2)})
    by_kind = []
    for name in KINDS:
        group = {t: r for t, r in results.items() if r["kind"] == name}
        if group:
            row = summarise(group, TARGET_BUDGET)["mean"]
            by_kind.append({"kind": name, "tasks": ", ".join(group), **{a: f"{row[a]:.2f}" for a in ARMS}})
    write_results(f"{name_}-kinds", by_kind, columns=["kind", "tasks", *ARMS], precision="bf16",
                  notes=f"Mean test metric (%) per kind of held-out task at {TARGET_BUDGET} full-trial equivalents "
                        "(accuracy; Pearson x 100 for the regression).")
    write_results(f"{name_}-tasks", per_task, columns=["task", "kind", "k", "oracle", *LIMITS, *ARMS], precision="bf16",
                  notes=f"Test accuracy (%) per held-out task at {TARGET_BUDGET} full-trial equivalents, the mean over "
                        f"seeds {seeds}; oracle: the best test accuracy of any candidate configuration on that task "
                        "(the mean over seeds of each seed's best); every by dev: every candidate trained, the best "
                        "dev answering; by test, other seed: the candidate with the best test at one seed, scored "
                        "at the other (on the tasks with two seeds; its mean is over those).")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        Path(args.json).write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]), "commit": commit, "date": time.strftime("%Y-%m-%d"),
            "meta_header": meta.header, "size": args.size, "margin": args.margin, "results": results}, indent=1))


def report(meta, results: dict, configs: list[str]) -> None:
    header = meta.header
    print(f"meta-dataset: {header.get('model')}, {len(meta.tasks)} tasks, K={header['protocol']['k']}, "
          f"{header['protocol']['epochs']} epochs, collected on {header.get('hardware', {}).get('name')}")
    for budget in BUDGETS:
        print(f"\n### {budget} full-trial equivalent{'s' if budget > 1 else ''}: test accuracy (%) of each arm's "
              "answer; last rows: mean, mean distance from the oracle, mean rank, mean normalised test regret\n")
        print("| task | oracle | " + " | ".join(ARMS) + " |")
        print("|---|---:|" + "---:|" * len(ARMS))
        for task, result in results.items():
            arms = result["arms"][budget]
            print(f"| {task} | {result['oracle']:.1f} | " + " | ".join(f"{arms[a]:.1f}" for a in ARMS) + " |")
        summary = summarise(results, budget)
        print("| **mean** | | " + " | ".join(f"**{summary['mean'][a]:.2f}**" for a in ARMS) + " |")
        print("| from oracle | | " + " | ".join(f"{summary['gap'][a]:+.2f}" for a in ARMS) + " |")
        print("| rank | | " + " | ".join(f"{summary['rank'][a]:.2f}" for a in ARMS) + " |")
        print("| regret | | " + " | ".join(f"{summary['regret'][a]:.2f}" for a in ARMS) + " |")
        print("| worst seed | | " + " | ".join(f"{summary['worst'][a]:.2f}" for a in ARMS) + " |")
    targets(results)


def with_limit(results: dict, limit: str) -> list[dict]:
    """The held-out tasks' results where the reference `limit` was measured (the other seed's needs two seeds)."""
    return [r for r in results.values() if not math.isnan(r["limits"][limit])]


def summarise(results: dict, budget: int) -> dict:
    mean = {a: statistics.mean(r["arms"][budget][a] for r in results.values()) for a in ARMS}
    gap = {a: statistics.mean(r["arms"][budget][a] - r["oracle"] for r in results.values()) for a in ARMS}
    ranks = {a: [] for a in ARMS}
    regrets = {a: [] for a in ARMS}
    for result in results.values():
        arms = result["arms"][budget]
        ordered = sorted(ARMS, key=lambda a: -arms[a])
        for a in ARMS:  # ties share the better rank
            ranks[a].append(1 + sum(arms[b] > arms[a] + 1e-9 for b in ordered))
        worst = min(arms.values())
        spread = max(result["oracle"] - worst, 1e-9)
        for a in ARMS:
            regrets[a].append((result["oracle"] - arms[a]) / spread)
    worst = {a: statistics.mean(r["worst"][budget][a] for r in results.values()) for a in ARMS}
    return {"mean": mean, "gap": gap, "worst": worst, "rank": {a: statistics.mean(v) for a, v in ranks.items()},
            "regret": {a: statistics.mean(v) for a, v in regrets.items()}}


def targets(results: dict) -> None:
    at = summarise(results, TARGET_BUDGET)["mean"]
    default = "task-aware+sampler"
    oracle = statistics.mean(r["oracle"] for r in results.values())
    lines = [
        (f"{default} − tuned LoRA at {TARGET_BUDGET} ≥ {TARGET_VS_LORA}", at[default] - at["tuned-lora"],
         TARGET_VS_LORA),
        (f"{default} − best single default at {TARGET_BUDGET} ≥ {TARGET_VS_SINGLE}",
         at[default] - at["best-single"], TARGET_VS_SINGLE),
        (f"{default} − per-task oracle at {TARGET_BUDGET} ≥ -{TARGET_VS_ORACLE}", at[default] - oracle,
         -TARGET_VS_ORACLE),
    ]
    print("\ntargets:")
    for text, value, target in lines:
        print(f"- {text}: {value:+.2f} ({'met' if value >= target else 'MISSED'})")
    many = {t: r for t, r in results.items() if r["kind"] == "many-class"}
    for arm in ("task-aware", default, "global", "global+sampler"):
        for null in ("random", "random+halving"):
            worst = min(summarise(results, b)["mean"][arm] - summarise(results, b)["mean"][null] for b in BUDGETS)
            print(f"- {arm} never below {null} (worst budget): {worst:+.2f} ({'met' if worst >= 0 else 'MISSED'})")
        if many:
            worst = min(summarise(many, b)["mean"][arm] - summarise(many, b)["mean"]["random+halving"]
                        for b in BUDGETS)
            print(f"- many-class tasks: {arm} never below random+halving (worst budget): {worst:+.2f} "
                  f"({'met' if worst >= 0 else 'MISSED'})")
    for null in ("random+halving", "random"):  # the first is the control's null: the same procedure, a random order
        control = max(summarise(results, b)["mean"]["shuffled-control"] - summarise(results, b)["mean"][null]
                      for b in BUDGETS)
        print(f"- shuffled control no better than {null} (best budget): {control:+.2f} "
              f"({'met' if control <= CONTROL_TOLERANCE else 'MISSED: the simulation may leak'})")
    print(f"\nreferences at {TARGET_BUDGET}, against the best single default and {default}, on the tasks where they "
          "exist:")
    for limit in LIMITS:
        held = with_limit(results, limit)
        if not held:
            print(f"- {limit}: no task has two seeds")
            continue
        value = statistics.mean(r["limits"][limit] for r in held)
        single, ours = (statistics.mean(r["arms"][TARGET_BUDGET][a] for r in held) for a in ("best-single", default))
        print(f"- {limit} ({len(held)} tasks): {value:.2f}; from it, best single {single - value:+.2f}, {default} "
              f"{ours - value:+.2f}")


if __name__ == "__main__":
    main()
