"""Backbone dropout on or off: test accuracy across the meta-dataset's tasks, paired by seed.

Reads the shipped meta-dataset (or --meta FILE): the dropout study's three configurations (LoRA r8 on q,v at 3e-3,
UniPELT(APL) at 1e-3, the Pfeiffer adapter at 1e-3) with the backbone's dropout as the model's config has it and
with it off, on every task at every seed both have. A trial answers with its best-dev epoch's test accuracy.
The rule for making `off` the default: mean paired difference over tasks no worse than -0.3 points and no task
worse than -1.0 point, for every configuration.

    python lab/experiments/backbone-dropout/dropout_quality.py [--meta FILE] [--json experiments/backbone-dropout/dropout_quality.json]
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
from metalearning.design import DROPOUT_STUDY  # noqa: E402
from results import write_results  # noqa: E402

MEAN_TOLERANCE, TASK_TOLERANCE = -0.3, -1.0


def compare(meta, config: str) -> dict:
    rows = {}
    for task in meta.tasks:
        pairs = []
        for seed in sorted({r["seed"] for r in meta.records}):
            on, off = meta.trial(task, config, seed), meta.trial(task, f"{config}~dropout-off", seed)
            if on and off and metadata.answer(on) and metadata.answer(off):
                pairs.append((100 * metadata.answer(on).test, 100 * metadata.answer(off).test,
                              on["train_seconds"], off["train_seconds"]))
        if pairs:
            rows[task] = {"seeds": len(pairs), "model": [p[0] for p in pairs], "off": [p[1] for p in pairs],
                          "delta": statistics.mean(p[1] - p[0] for p in pairs)}
    deltas = [row["delta"] for row in rows.values()]
    return {"tasks": rows, "mean_delta": statistics.mean(deltas), "worst_delta": min(deltas),
            "meets": statistics.mean(deltas) >= MEAN_TOLERANCE and min(deltas) >= TASK_TOLERANCE}


def _cell(values: list[float]) -> str:
    spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.1f}{spread}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta", help="meta-dataset file (default: the shipped one)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    meta = metadata.load(args.meta) if args.meta else metadata.load(metadata.SHIPPED / "all-MiniLM-L6-v2-v1.json")  # the v1 meta-dataset it ran on
    results = {config: compare(meta, config) for config in DROPOUT_STUDY}
    print(f"meta-dataset: {meta.header.get('model')} on {meta.header.get('hardware', {}).get('name')}, "
          f"K={meta.header['protocol']['k']}, {meta.header['protocol']['epochs']} epochs; test accuracy (%), "
          "mean ± std over seeds; Δ = off − model, paired by seed\n")
    print("| task | " + " | ".join(f"{c} model | off | Δ" for c in DROPOUT_STUDY) + " |")
    print("|---|" + "---:|---:|---:|" * len(DROPOUT_STUDY))
    for task in meta.tasks:
        cells = []
        for config in DROPOUT_STUDY:
            row = results[config]["tasks"].get(task)
            cells += [_cell(row["model"]), _cell(row["off"]), f"{row['delta']:+.1f} ({row['seeds']})"] if row \
                else ["–", "–", "–"]
        print(f"| {task} | " + " | ".join(cells) + " |")
    print("| **mean Δ / worst task** | " + " | ".join(
        f" | | **{r['mean_delta']:+.2f} / {r['worst_delta']:+.1f}**" for r in results.values()) + " |")
    verdict = all(r["meets"] for r in results.values())
    print(f"\nrule: mean Δ ≥ {MEAN_TOLERANCE} and every task ≥ {TASK_TOLERANCE} for every configuration: "
          f"{'met: off can be the default' if verdict else 'NOT met: the model dropout stays the default'}")
    rows = []
    for task in [*meta.tasks, "mean"]:
        row = {"task": task}
        for config in DROPOUT_STUDY:
            r = results[config]
            if task == "mean":
                row[f"{config} Δ"] = f"{r['mean_delta']:+.2f}"
                continue
            t = r["tasks"].get(task)
            row[f"{config} model"] = _cell(t["model"]) if t else None
            row[f"{config} off"] = _cell(t["off"]) if t else None
            row[f"{config} Δ"] = f"{t['delta']:+.2f}" if t else None
        rows.append(row)
    write_results("dropout-quality", rows, columns=list(rows[0]), precision="bf16",
                  settings={"configurations": list(DROPOUT_STUDY), "rule": [MEAN_TOLERANCE, TASK_TOLERANCE]},
                  notes=f"Test accuracy (%), mean ± std over seeds; Δ = off − model paired by seed. Verdict: "
                        f"{'off meets the rule' if verdict else 'off misses the rule'}. Trials ran on "
                        f"{meta.header.get('hardware', {}).get('name')}.")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "meta_header": meta.header,
                                               "results": results, "verdict": verdict}, indent=1))


if __name__ == "__main__":
    main()
