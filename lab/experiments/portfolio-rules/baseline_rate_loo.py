"""Leave-one-task-out judgement of how a portfolio learns UniPELT(APL)'s rate (autopelt/portfolio/build.py).

For each of the meta-dataset's twelve tasks, the rate is learned from the other eleven by each rule, and the held-out
task's test accuracy at that rate is read at both selection seeds (the design's trials, K=1000, 3 epochs, the
kept epoch chosen by dev): the mean and the worst seed. Rules: the best mean dev over the tasks and seeds (what a
portfolio used before), and the rate that collapsed at the fewest (task, seed) runs where another rate learned,
then the best mean dev (`meta_build.baseline_rates`, today's). Writes and prints `baseline-rate-loo`.

    python lab/experiments/portfolio-rules/baseline_rate_loo.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"


def main() -> None:
    from autopelt.search.baselines import baseline_spec
    from metalearning import build as meta_build, metadata
    from metalearning.design import config_named, rate_text

    meta = metadata.load(metadata.SHIPPED / "all-MiniLM-L6-v2-v1.json")  # the v1 meta-dataset it ran on
    spec = baseline_spec("unipelt_apl", "mean")
    runs = [c for c in meta.candidates() if meta_build._is_structure(config_named(c), spec)]
    by_rate = {config_named(c).learning_rate: c for c in runs}
    rows = []
    for task in meta.tasks:
        others = [t for t in meta.tasks if t != task]
        scores = meta.dev_scores(others, runs)
        mean_dev = config_named(max(runs, key=lambda c: sum(row[c] for row in scores.values()))).learning_rate
        collapse = meta_build.baseline_rates(meta, others)["unipelt_apl"]
        row = {"held_out": task}
        for rule, rate in (("mean dev", mean_dev), ("fewest collapses", collapse)):
            tests = [100 * metadata.answer(meta.trial(task, by_rate[rate], s)).test for s in meta.selection_seeds]
            row[f"{rule}: rate"] = rate_text(rate)
            row[f"{rule}: test"] = round(statistics.fmean(tests), 1)
            row[f"{rule}: worst"] = round(min(tests), 1)
        row["Δ"] = round(row["fewest collapses: test"] - row["mean dev: test"], 1)
        rows.append(row)
    mean = {"held_out": "mean", **{k: round(statistics.fmean(r[k] for r in rows), 2) for k in rows[0]
                                   if k.endswith((": test", ": worst")) or k == "Δ"}}
    rows.append(mean)
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "–")) for c in columns) + " |")
    sys.path.insert(0, str(ROOT / "bench"))
    from results import write_results

    path = write_results("baseline-rate-loo", rows, columns, settings={
        "meta_dataset": "shipped", "baseline": "unipelt_apl", "rates": sorted(by_rate),
        "seeds": list(meta.selection_seeds)},
        notes="test accuracy (%) of UniPELT(APL) on the held-out task at the rate each rule learned from the other "
              "eleven; mean and worst over the two selection seeds; Δ: fewest collapses minus mean dev")
    print(f"({path})")


if __name__ == "__main__":
    main()
