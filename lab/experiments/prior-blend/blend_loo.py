"""Does a blended prior beat the nearest-k one? Leave-one-task-out on the shipped meta-dataset.

    python lab/experiments/prior-blend/blend_loo.py [--jobs N]

The shipped prior (autopelt/portfolio/prior.py) learns a task's portfolio from its k nearest tasks only; the global
portfolio learns it from all, equally. A blend weighs the k nearest 1 and every other task `lam` in the greedy
selection's mean regret (autopelt/portfolio/select.py, weighted): lam 0 is the shipped prior, lam 1 the global
portfolio. Each held-out task's (k, lam) is chosen by leave-one-task-out over the other 20 (nested, as
bench/portfolio_loo.py chooses k), and successive halving over its portfolio is simulated at 8 full-trial
equivalents, both seeds (metalearning/simulate.py, the search's answer rule). Prints and writes
benchmarks/results/prior-blend-loo-<date>.json: the nested blend against the nested nearest-k prior and the
global portfolio, per task and on the mean.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"
sys.path[:0] = [str(ROOT / "lab"), str(ROOT / "bench")]

from autopelt.portfolio import select  # noqa: E402
from metalearning import metadata, prior, simulate  # noqa: E402

BUDGET, SIZE = prior.BUDGET, prior.SIZE
LAMS = (0.0, 0.1, 0.25, 0.5)
META = ROOT / "lab" / "metalearning/data/all-MiniLM-L6-v2.json"


def portfolio_for(meta, features, task: str, others: list[str], k: int, lam: float, built=None) -> list[str]:
    built = built or prior.build(meta, features, len(others), others)  # distances over the others' spread
    nearest = [name for name, _ in built.distances(features[task])]
    near = set(nearest[:k])
    weights = {t: 1.0 if t in near else lam for t in others}
    used = [t for t in others if weights[t] > 0]
    return select.greedy_portfolio({t: built.scores[t] for t in used}, SIZE, {t: weights[t] for t in used})


def test_of(meta, task: str, names: list[str]) -> float:
    return statistics.mean(simulate.Task(meta, task, seed=s).halving(names, BUDGET, favourite=True).test
                           for s in prior.task_seeds(meta, task, names))


def grid(n: int) -> list[tuple[int, float]]:
    return [(k, lam) for k in prior.CANDIDATE_K if k < n for lam in LAMS] + [(n, 0.0)]


def choose(meta, features, tasks: list[str]) -> tuple[tuple[int, float], tuple[int, float]]:
    """((k, lam) of the best leave-one-out mean over `tasks`, k of the best with lam 0); ties to the larger."""
    means = {key: [] for key in grid(len(tasks) - 1)}
    for t in tasks:
        others = [o for o in tasks if o != t]
        built = prior.build(meta, features, len(others), others)
        for k, lam in means:
            means[(k, lam)].append(test_of(meta, t, portfolio_for(meta, features, t, others, k, lam, built)))
    means = {key: statistics.mean(values) for key, values in means.items()}
    best = max(means, key=lambda key: (round(means[key], 6), key))
    plain = max((key for key in means if key[1] == 0.0), key=lambda key: (round(means[key], 6), key))
    return best, plain


def fold(task: str) -> dict:
    meta = metadata.load(META)
    features = prior.features_of(meta)
    others = [t for t in meta.tasks if t != task]
    (k, lam), (k0, _) = choose(meta, features, others)
    return {"task": task, "k": k, "lam": lam, "k_plain": k0,
            "blend": 100 * test_of(meta, task, portfolio_for(meta, features, task, others, k, lam)),
            "nearest-k": 100 * test_of(meta, task, portfolio_for(meta, features, task, others, k0, 0.0)),
            "global": 100 * test_of(meta, task, portfolio_for(meta, features, task, others, len(others), 0.0))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    from results import write_results  # bench/results.py

    meta = metadata.load(META)
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(fold, meta.tasks))
    arms = ("blend", "nearest-k", "global")
    for row in rows:
        print(f"{row['task']:20s} k {row['k']:2d} lam {row['lam']:.2f} (plain k {row['k_plain']:2d})  "
              + "  ".join(f"{a} {row[a]:.2f}" for a in arms))
    means = {a: statistics.mean(r[a] for r in rows) for a in arms}
    diffs = [r["blend"] - r["nearest-k"] for r in rows]
    print("mean: " + ", ".join(f"{a} {v:.2f}" for a, v in means.items())
          + f"; blend - nearest-k {statistics.mean(diffs):+.2f} ({sum(d > 0.05 for d in diffs)} better, "
          f"{sum(d < -0.05 for d in diffs)} worse)")
    table = [{**r, **{a: round(r[a], 2) for a in arms}} for r in rows]
    path = write_results("prior-blend-loo", table + [{"task": "mean", **{a: round(v, 2) for a, v in means.items()}}],
                         columns=["task", "k", "lam", "k_plain", *arms],
                         settings={"budget": BUDGET, "size": SIZE, "lams": LAMS, "ks": prior.CANDIDATE_K,
                                   "seeds": meta.selection_seeds},
                         notes=f"Test (%) of successive halving at {BUDGET} equivalents over each held-out task's "
                               "portfolio, (k, lam) chosen by nested leave-one-task-out; the mean of both seeds.")
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
