"""Do rates measured relative to LoRA's swept rate carry across tasks better than absolute rates?

A configuration family (its name without the rate) with several rates in the meta-dataset is held out task by task.
On the other tasks its rate is learned two ways: absolute (the rate with the best mean dev over those tasks, what
a portfolio records today) and calibrated (the geometric mean, over those tasks, of its best-dev rate divided by
the rate LoRA r8 (q,v)'s simulated sweep chose there, metalearning/simulate.tuned_lora). On the held-out task, at
each seed, the calibrated rate is that ratio times the rate the sweep chose on this task and seed, snapped to the
nearest rate the family was collected at. Scored: the held-out task's test metric of the rate each way picks (dev
selects nothing here: the rate is predicted), beside the family's best rate by the held-out task's dev.

Within one model this asks whether a task's LoRA rate says something about other families' rates on that task;
across models (issue 47) it is the mechanism itself, which this file cannot test without a second model's data.

    python lab/experiments/rate-calibration/calibration_loo.py --meta metalearning/data/all-MiniLM-L6-v2.json \\
        --meta metalearning/data/all-MiniLM-L6-v2-v1.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from metalearning import metadata, simulate
from metalearning.metadata import answer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from results import write_results  # noqa: E402

LORA = "lora-r8-qv"


def family_and_rate(config: str) -> tuple[str, float]:
    name, _, rest = config.partition("@")
    rate, _, modifier = rest.partition("~")
    return name + (f"~{modifier}" if modifier else ""), float(rate)


def families(meta, seeds) -> dict[str, dict[float, str]]:
    """family -> rate -> configuration, for families with two or more rates complete on every task and seed."""
    complete = [c for c in meta.configs(0, complete=False)
                if all(meta.trial(t, c, s) for t in meta.tasks for s in seeds)]
    out = defaultdict(dict)
    for config in complete:
        family, rate = family_and_rate(config)
        out[family][rate] = config
    return {f: rates for f, rates in out.items() if len(rates) >= 2 and f != LORA}


def run(meta, seeds) -> dict:
    fams = families(meta, seeds)
    sweep = {(t, s): family_and_rate(simulate.tuned_lora(simulate.Task(meta, t, seed=s)).config)[1]
             for t in meta.tasks for s in seeds}

    def dev(t, config):
        return statistics.mean(answer(meta.trial(t, config, s)).dev for s in seeds)

    def calibration(t):  # the task's LoRA rate: the geometric mean over seeds of the sweep's choice
        return math.exp(statistics.mean(math.log(sweep[t, s]) for s in seeds))

    rows, cases = [], defaultdict(list)
    for family, rates in sorted(fams.items()):
        for held in meta.tasks:
            others = [t for t in meta.tasks if t != held]
            absolute = max(rates, key=lambda r: statistics.mean(dev(t, rates[r]) for t in others))
            ratio = math.exp(statistics.mean(
                math.log(max(rates, key=lambda r: dev(t, rates[r])) / calibration(t)) for t in others))
            for seed in seeds:
                target = ratio * sweep[held, seed]
                calibrated = min(rates, key=lambda r: abs(math.log(r / target)))
                at = {r: answer(meta.trial(held, c, seed)) for r, c in rates.items()}
                best_dev = max(rates, key=lambda r: at[r].dev)
                case = {"family": family, "task": held, "seed": seed, "lora_rate": sweep[held, seed],
                        "absolute": absolute, "calibrated": calibrated, "best_by_dev": best_dev,
                        "test": {"absolute": 100 * at[absolute].test, "calibrated": 100 * at[calibrated].test,
                                 "best by dev": 100 * at[best_dev].test}}
                rows.append(case)
                cases[family].append(case)
    table = []
    for family, group in sorted(cases.items()):
        table.append({"family": family, "rates": " ".join(f"{r:g}" for r in sorted(fams[family])),
                      **{k: statistics.mean(c["test"][k] for c in group) for k in ("absolute", "calibrated",
                                                                                   "best by dev")},
                      "differ": sum(c["absolute"] != c["calibrated"] for c in group), "cases": len(group),
                      "calibrated=best": sum(c["calibrated"] == c["best_by_dev"] for c in group),
                      "absolute=best": sum(c["absolute"] == c["best_by_dev"] for c in group)})
    return {"families": table, "cases": rows,
            "lora_rates": {f"{t}/{s}": r for (t, s), r in sweep.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta", action="append", help="meta-dataset file(s) (default: the shipped one)")
    args = parser.parse_args()
    metas = [(p, metadata.load(p)) for p in args.meta] if args.meta else [("shipped", metadata.shipped())]
    rows, cases = [], {}
    for path, meta in metas:
        seeds = tuple(s for s in meta.seeds if all(meta.trial(t, f"{LORA}@1e-3", s) for t in meta.tasks)) or (0,)
        result = run(meta, seeds)
        label = f"{Path(path).stem}: {len(meta.tasks)} tasks, seeds {','.join(map(str, seeds))}"
        cases[label] = {"lora_rates": result["lora_rates"], "cases": result["cases"]}
        print(f"\n{label}; LoRA's swept rate per task: "
              + ", ".join(f"{k} {v:g}" for k, v in result["lora_rates"].items()))
        fam = result["families"]
        for row in fam + [{"family": f"mean of {len(fam)}", "rates": "",
                           **{k: statistics.mean(r[k] for r in fam) for k in ("absolute", "calibrated",
                                                                              "best by dev")},
                           **{k: sum(r[k] for r in fam) for k in ("differ", "cases", "calibrated=best",
                                                                  "absolute=best")}}]:
            rows.append({"meta-dataset": label, "family": row["family"], "rates": row["rates"],
                         "absolute": round(row["absolute"], 2), "calibrated": round(row["calibrated"], 2),
                         "best rate by dev": round(row["best by dev"], 2),
                         "rate differs": f"{row['differ']}/{row['cases']}",
                         "calibrated = dev-best": row["calibrated=best"], "absolute = dev-best": row["absolute=best"]})
            print(" | ".join(str(v) for v in rows[-1].values()))
    write_results("calibration-loo", rows, precision="the meta-datasets' (bf16 on a GPU, fp32 for CPU trials)",
                  settings={"meta": [p for p, _ in metas], "cases": cases},
                  notes="test (%) of each family's rate chosen for a held-out task, the mean over tasks and seeds: "
                        "absolute (its best mean dev on the other tasks), calibrated (its ratio to LoRA's swept "
                        "rate on the other tasks, times LoRA's swept rate on the held-out task, snapped to the "
                        "rates collected), the best of its rates by the held-out dev; LoRA's rate: the simulated "
                        "sweep (metalearning/simulate.tuned_lora)", out_dir=Path(__file__).parent)


if __name__ == "__main__":
    main()
