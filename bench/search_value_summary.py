"""One table over several `bench/search_value.py` runs: each arm's test accuracy, worst seed and paired difference
to autopelt's pick, a row per task, read from the newest `search-value-<task>` results files.

    python bench/search_value_summary.py --tasks trec,tweeteval_emotion,qnli [--name search-value-held-out]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from render_docs import newest  # noqa: E402
from results import write_results  # noqa: E402

ARMS = {"autopelt pick": "autopelt", "tuned-lora pick": "tuned LoRA", "baseline unipelt_apl": "UniPELT(APL)",
        "random pick": "random"}


def summary(tasks: list[str], run_label: str | None = None, folder: Path | None = None) -> list[dict]:
    rows = []
    for task in tasks:
        results = f"search-value-{task}" + (f"-{run_label}" if run_label else "")
        record = newest(results, *([folder] if folder else []))
        if record is None:
            raise SystemExit(f"no {results} results: run bench/search_value.py --task {task} first")
        arms = {row["delta"]: row for row in record["rows"]}
        row = {"task": task, "equivalents": record["settings"].get("equivalents"),
               "seeds": len(record["settings"].get("rerun_seeds", []))}
        for label, name in ARMS.items():
            arm = arms.get(label)
            if arm is None:
                continue
            mean, worst = 100 * arm["test_mean"], 100 * arm["test_min"] if arm.get("test_min") is not None else None
            row[name] = f"{mean:.1f}" + (f" (worst {worst:.1f})" if worst is not None else "")
            if label != "autopelt pick" and arm.get("paired_delta") is not None:
                row[f"Δ vs {name}"] = round(-100 * arm["paired_delta"], 1)  # autopelt's pick minus the arm
        rows.append(row)
    deltas = [k for k in rows[0] if k.startswith("Δ")]
    rows.append({"task": "mean", **{k: round(statistics.fmean(r[k] for r in rows if k in r), 1) for k in deltas}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", required=True, type=lambda s: s.split(","))
    parser.add_argument("--label", help="read search-value-TASK-LABEL (search_value.py --label)")
    parser.add_argument("--name", help="results name (default: search-value-held-out[-LABEL])")
    args = parser.parse_args()
    rows = summary(args.tasks, args.label)
    columns = ["task", *ARMS.values(), *[f"Δ vs {name}" for name in list(ARMS.values())[1:]]]
    for row in rows:
        print(" | ".join(str(row.get(c, "")) for c in columns))
    write_results(args.name or "search-value-held-out" + (f"-{args.label}" if args.label else ""), rows, columns=columns, settings={"tasks": args.tasks},
                  notes="Test accuracy (%) over re-run seeds 1-5 of each arm's pick (worst seed in brackets); Δ: "
                        "autopelt's pick minus the arm, paired by seed, in points; from the search-value-<task> files.")


if __name__ == "__main__":
    main()
