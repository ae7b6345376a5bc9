"""Does the study's dev metric rank deltas by their test accuracy? Reads search-value work dirs.

For every delta `bench/search_value.py` re-trained with five seeds (its picks and baselines), compares the dev
metric its study saw (one seed) and the mean dev of the re-runs with the mean test of the re-runs, as Spearman's
rank correlation per task. A delta re-trained in several work dirs counts once.

    python lab/experiments/selection/dev_ranks.py /work/benchwork/value-sst2-20 /work/benchwork/value-sst2=value-sst2-b.log ...

Each work dir needs the table the bench printed: in <work dir>.log beside it, or in the file DIR=LOG names
(relative to the work dir's parent).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROW = re.compile(r"\| (autopelt pick|random pick|tuned-lora pick|baseline \S+) \| (.*?) \| (\S+) \| \S+ \| ([\d.]+) "
                 r"\| ([\d.]+) ±")


def ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            result[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(a: list[float], b: list[float]) -> float:
    return statistics.correlation(ranks(a), ranks(b))


def deltas(work_dir: Path, log: Path) -> list[dict]:
    """{task, label, what, lr, study_dev, dev, test} of each five-seed re-run the work dir's table lists."""
    if not log.is_file():
        sys.exit(f"no {log}: give work dirs of bench/search_value.py whose output was saved beside them")
    task = next((m.group(1) for m in re.finditer(r"^## (\S+) ·", log.read_text(), re.M)), "?")
    found = []
    for match in ROW.finditer(log.read_text()):
        label = match.group(1).replace(" pick", "-pick").replace("baseline ", "baseline-")
        runs = [json.loads(f.read_text()) for f in sorted((work_dir / "reruns" / label).glob("seed-*/result.json"))]
        if len(runs) < 2:
            continue
        found.append({"task": task, "label": f"{work_dir.name} {label}", "what": match.group(2),
                      "lr": match.group(3), "study_dev": float(match.group(4)),
                      "dev": 100 * statistics.fmean(r["dev_metric"] for r in runs),
                      # two seeds' dev against the other seeds' test: runs that share nothing
                      "dev_12": 100 * statistics.fmean(r["dev_metric"] for r in runs if r["seed"] in (1, 2)),
                      "test_rest": 100 * statistics.fmean(r["test"][r["metric"]] for r in runs if r["seed"] > 2),
                      "test": float(match.group(5))})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dirs", nargs="+", metavar="DIR[=LOG]")
    parser.add_argument("--results", action="store_true", help="also write benchmarks/results/dev-ranks-TASK-*.json")
    args = parser.parse_args()
    by_task: dict[str, dict[tuple, dict]] = {}
    for given in args.work_dirs:
        work_dir, _, log = given.partition("=")
        work_dir = Path(work_dir)
        log = work_dir.parent / log if log else work_dir.with_name(work_dir.name + ".log")
        for delta in deltas(work_dir, log):
            by_task.setdefault(delta["task"], {}).setdefault((delta["what"], delta["lr"]), delta)
    for task, found in by_task.items():
        rows = list(found.values())
        print(f"## {task}\n\n| delta | what | lr | study dev (seed 0) | dev, seeds 1-2 | dev, re-runs | test, seeds 3-5 "
              "| test, re-runs |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['label']} | {r['what']} | {r['lr']} | {r['study_dev']:.1f} | {r['dev_12']:.1f} | {r['dev']:.1f} "
                  f"| {r['test_rest']:.1f} | {r['test']:.1f} |")
        if args.results:
            sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # bench/results.py
            from results import write_results

            write_results(f"dev-ranks-{task}", rows, settings={"work_dirs": args.work_dirs})
        if len(rows) > 2:
            rho = lambda a, b: spearman([r[a] for r in rows], [r[b] for r in rows])
            print(f"\nSpearman's rho over {len(rows)} deltas: the study's dev (seed 0) against the test of seeds 3-5 "
                  f"{rho('study_dev', 'test_rest'):.2f}, the dev of seeds 1-2 against it {rho('dev_12', 'test_rest'):.2f}; "
                  f"the study's dev against the re-runs' test {rho('study_dev', 'test'):.2f}, the re-runs' dev against "
                  f"it {rho('dev', 'test'):.2f} (the same runs)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
