"""Do the search's hand rules help on tasks they were not chosen on? Each rule of autopelt/search/refine.py (and
the mean-pooling default) as pairs of meta-dataset configurations, base -> reshaped, on the ten tasks other than
SST-2 and SNLI (where the rules were chosen): the paired test difference at seed 0, and how often dev would have
picked the reshaped one and been right.

    python lab/experiments/portfolio-rules/rules_loo.py [--meta FILE] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from metalearning import metadata  # noqa: E402
from results import write_results  # noqa: E402

CHOSEN_ON = ("sst2", "snli")
RULES = {  # rule -> (base, reshaped) pairs of design configurations
    "half the batch (rate / sqrt 2)": [("lora-r8-qv@3e-3", "lora-r8-qv-b16@2e-3"),
                                       ("lora-r8-qv-ffn@3e-3", "lora-r8-qv-ffn-b16@2e-3"),
                                       ("pfeiffer-48@1e-3", "pfeiffer-48-b16@1e-3"),
                                       ("unipelt-apl@1e-3", "unipelt-apl-b16@1e-3")],
    "LoRA in more places (the FFN)": [("lora-r8-qv@3e-3", "lora-r8-qv-ffn@3e-3"),
                                      ("lora-r8-qv@1e-3", "lora-r8-qv-ffn@1e-3")],
    "a higher rate (3x)": [("lora-r8-qv@1e-3", "lora-r8-qv@3e-3"), ("pfeiffer-48@1e-3", "pfeiffer-48@3e-3"),
                           ("unipelt-apl@1e-3", "unipelt-apl@3e-3"), ("prefix-10@1e-3", "prefix-10@3e-3")],
    "mean pooling instead of the first token": [("lora-r8-qv-cls@3e-3", "lora-r8-qv@3e-3"),
                                                ("pfeiffer-48-cls@1e-3", "pfeiffer-48@1e-3"),
                                                ("unipelt-apl-cls@1e-3", "unipelt-apl@1e-3")],
    "backbone dropout off": [("lora-r8-qv@3e-3", "lora-r8-qv@3e-3~dropout-off"),
                             ("pfeiffer-48@1e-3", "pfeiffer-48@1e-3~dropout-off"),
                             ("unipelt-apl@1e-3", "unipelt-apl@1e-3~dropout-off")],
}


def evaluate(meta, pairs: list[tuple[str, str]]) -> dict:
    tasks = [t for t in meta.tasks if t not in CHOSEN_ON]
    deltas, wins, dev_right = [], 0, 0
    pairs = [(a, b) for a, b in pairs if meta.trial(tasks[0], a) and meta.trial(tasks[0], b)]  # in this design
    if not pairs:
        return {"pairs": 0, "mean_delta": float("nan"), "wins": 0, "losses": 0, "dev_agrees": 0, "tasks": tasks}
    for task in tasks:
        for base, reshaped in pairs:
            a, b = metadata.answer(meta.trial(task, base)), metadata.answer(meta.trial(task, reshaped))
            delta = 100 * (b.test - a.test)
            deltas.append(delta)
            wins += delta > 0
            dev_right += (b.dev > a.dev) == (b.test > a.test)
    return {"pairs": len(deltas), "mean_delta": statistics.mean(deltas), "wins": wins,
            "losses": sum(d < 0 for d in deltas), "dev_agrees": dev_right, "tasks": tasks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta")
    parser.add_argument("--json")
    parser.add_argument("--name", default="rules-loo", help="results name (rules-loo-v2 for the 21-task meta-dataset)")
    args = parser.parse_args()
    meta = metadata.load(args.meta) if args.meta else metadata.load(metadata.SHIPPED / "all-MiniLM-L6-v2-v1.json")  # the v1 meta-dataset it ran on
    results = {rule: evaluate(meta, pairs) for rule, pairs in RULES.items()}
    print(f"test accuracy difference reshaped − base (points), seed 0, on the {len(results[next(iter(RULES))]['tasks'])}"
          f" tasks other than {', '.join(CHOSEN_ON)}\n")
    print("| rule | pairs | mean Δ test | better / worse | dev agrees with test |")
    print("|---|---:|---:|---:|---:|")
    for rule, r in results.items():
        print(f"| {rule} | {r['pairs']} | {r['mean_delta']:+.2f} | {r['wins']} / {r['losses']} | "
              f"{r['dev_agrees']} of {r['pairs']} |")
    write_results(args.name, [{"rule": rule, "pairs": r["pairs"], "mean Δ test": f"{r['mean_delta']:+.2f}",
                                 "better": r["wins"], "worse": r["losses"], "dev agrees": r["dev_agrees"]}
                                for rule, r in results.items()],
                  notes=f"Test metric difference reshaped − base (points), seed 0, on the "
                        f"{len(results[next(iter(RULES))]['tasks'])} tasks other than SST-2 and SNLI; pairs whose "
                        "configurations the meta-dataset's design lacks are left out.")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=1))


if __name__ == "__main__":
    main()
