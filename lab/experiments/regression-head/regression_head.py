"""A regression's head started at the training labels' mean, against the head as the model initialises it (bias 0).

Three comparisons, each of trials trained before (commit 60d47d2) and after (d6fadfd) the change, same settings:

- `--reruns-before DIR --reruns-after DIR`: bench/search_value.py's re-runs of a live study's picks (folders
  `<label>/seed-<n>/result.json`), paired by seed, on one machine: the test metric of each.
- `--judge-before FILE --judge-after FILE`: `python -m metalearning collect` JSON Lines of one task the change was
  not motivated by (SST-5 with its five classes as the numbers 1-5, a regression), paired by configuration and
  seed: the answer's test metric (its best dev epoch's).
- `--design-before META --design-after FILE`: every configuration of the meta-dataset's design on the task that
  prompted it (emobank_valence), the shipped meta-dataset before and the new collection after: the answers' mean
  test metric, and how many configurations learned nothing (mean dev Pearson below 0.1).

    python lab/experiments/regression-head/regression_head.py --reruns-before A --reruns-after B \\
        --judge-before F1 --judge-after F2 --design-before META --design-after F3
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

TASK = "emobank_valence"
LEARNED = 0.1  # a mean dev Pearson below this: the configuration learned nothing


def reruns(folder: Path) -> dict[tuple[str, int], dict]:
    out = {}
    for path in sorted(folder.glob("*/seed-*/result.json")):
        result = json.loads(path.read_text())
        if result.get("status") == "ok":
            out[(path.parent.parent.name, int(path.parent.name.split("-")[1]))] = result
    return out


def collected(path: Path, task: str | None = None) -> dict[tuple[str, int], metadata.Answer]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["config"], r["seed"]): metadata.answer(r) for r in records
            if (task is None or r["task"] == task) and metadata.answer(r)}


def spread(values: list[float]) -> str:
    values = [100 * v for v in values]
    std = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.1f}{std} (worst {min(values):.1f})"


def paired_rows(kind: str, before: dict, after: dict, value) -> list[dict]:
    """One row per label (the first key part): before and after over the shared second key parts, paired."""
    rows = []
    for label in sorted({key[0] for key in before}):
        keys = sorted(key for key in before if key[0] == label and key in after)
        if not keys:
            continue
        old, new = [value(before[k]) for k in keys], [value(after[k]) for k in keys]
        deltas = [100 * (b - a) for a, b in zip(old, new)]
        rows.append({"comparison": kind, "what": label, "runs": len(keys), "before": spread(old),
                     "after": spread(new), "Δ": round(statistics.mean(deltas), 1),
                     "worst Δ": round(min(deltas), 1), "_before": old, "_after": new, "_deltas": deltas})
    if len(rows) > 1:
        old = [statistics.mean(row["_before"]) for row in rows]
        new = [statistics.mean(row["_after"]) for row in rows]
        rows.append({"comparison": kind, "what": f"mean of {len(rows)}", "runs": sum(row["runs"] for row in rows),
                     "before": spread(old), "after": spread(new),
                     "Δ": round(statistics.mean(d for row in rows for d in row["_deltas"]), 1),
                     "worst Δ": round(min(d for row in rows for d in row["_deltas"]), 1)})
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def design_rows(before: metadata.MetaDataset, after: dict) -> list[dict]:
    old = {(r["config"], r["seed"]): metadata.answer(r) for r in before.records
           if r["task"] == TASK and metadata.answer(r)}
    shared = sorted(set(old) & set(after))
    configs = sorted({c for c, _ in shared})

    def summary(answers: dict) -> tuple[float, int, str]:
        by_config = {c: [answers[k] for k in shared if k[0] == c] for c in configs}
        tests = [statistics.mean(a.test for a in v) for v in by_config.values()]
        floor = sum(statistics.mean(a.dev for a in v) < LEARNED for v in by_config.values())
        best = max(by_config, key=lambda c: statistics.mean(a.dev for a in by_config[c]))
        return statistics.mean(tests), floor, best

    (old_mean, old_floor, old_best), (new_mean, new_floor, new_best) = summary(old), summary(after)
    deltas = [100 * (after[k].test - old[k].test) for k in shared]
    return [{"comparison": "emobank design", "what": f"{len(configs)} configurations, mean", "runs": len(shared),
             "before": f"{100 * old_mean:.1f} ({old_floor} learned nothing; best by dev {old_best})",
             "after": f"{100 * new_mean:.1f} ({new_floor} learned nothing; best by dev {new_best})",
             "Δ": round(statistics.mean(deltas), 1), "worst Δ": round(min(deltas), 1)}]


def print_table(rows: list[dict]) -> list[str]:
    """Print `rows` one line each, cells joined by " | ", under their columns; return the columns."""
    columns = list(rows[0])
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    return columns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("reruns-before", "reruns-after", "judge-before", "judge-after", "design-before", "design-after"):
        parser.add_argument(f"--{name}", required=True, type=Path)
    args = parser.parse_args()
    test = lambda result: result["test"][result["metric"]]  # noqa: E731
    rows = paired_rows("emobank re-runs", reruns(args.reruns_before), reruns(args.reruns_after), test)
    rows += paired_rows("sst5 as a regression", collected(args.judge_before), collected(args.judge_after),
                        lambda a: a.test)
    rows += design_rows(metadata.load(args.design_before), collected(args.design_after, TASK))
    columns = print_table(rows)
    path = write_results("regression-head", rows, columns=columns, precision="bf16",
                         settings={"before": "60d47d2", "after": "d6fadfd", "learned_below": LEARNED},
                         notes="Test Pearson r x 100, mean ± std over the runs (worst in brackets); Δ: after − before, "
                               "paired by seed (and configuration), in points. Re-runs and SST-5 ran on one CPU, "
                               "before and after; emobank's design before is the meta-dataset's (NVIDIA H200, "
                               "bf16 autocast), after on the CPU (bf16 autocast).")
    print(f"written {path}")


if __name__ == "__main__":
    main()
