"""What the budget after the portfolio should buy: the portfolio alone, today's TPE, or the leaders again at other
rates before TPE (`autopelt search --sampler none | tpe | leaders`, autopelt/search/leaders.py), live.

For each budget, seed, task and arm, one `autopelt search` as a user runs it (K rows, one worker, the seed as its
rows' and training seed), every arm on the same rows and the same portfolio: on a task the shipped portfolio was
learned from, a portfolio built without it (`PYTHONPATH=lab python -m metalearning prior --leave-out TASK`), so
that no arm is judged on a task its members were chosen on. Each row: the single answer's dev and test, the
study's ensemble's test (chosen on dev alone, scored once at the end) and whether it answers, what the user takes
away (the ensemble where it answers), the trials by phase and the wall time. A row is written when its search
ends, so a killed run resumes at the next one. `--jobs 2 --cpus-per-trial 1` runs two searches at once, each on
one core (half the compute of a search alone on this 2-core CPU at the same wall-time budget; every arm alike).

    python lab/experiments/sampler-share/sampler_share.py run --tasks trec,tweeteval_emotion,qnli --seeds 0 1 \\
        --budgets 10m --jobs 2 --cpus-per-trial 1
    python lab/experiments/sampler-share/sampler_share.py summary  # benchmarks/results/sampler-share-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from results import ROOT, write_results  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
GLUE = {"rte", "mrpc", "sst2"}  # ../shared/data/glue; the rest are ../shared/data/tasks/<task>/{train,validation}
DEFAULT_WORK = ROOT / "benchmarks" / "runs" / "sampler-share"  # rows.jsonl, committed: a later session resumes
DEFAULT_SCRATCH = Path("/tmp/sampler-share")  # studies, trials and leave-one-out portfolios (not kept)
ARMS = ("none", "tpe", "leaders")
REFERENCE = "tpe"  # the default before these cells decided it: every arm is paired against it


def portfolio_for(task: str, scratch: Path) -> str:
    """The shipped portfolio where it never saw `task`, else one built without it."""
    from autopelt.portfolio.portfolio import SHIPPED, load

    learned = load(SHIPPED).built_from.get("tasks", [])
    if task not in learned:
        return "auto"
    path = scratch / "portfolios" / f"{task}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "metalearning", "prior", "--leave-out", task, "--out", str(path)],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "lab")})
    return str(path)


def task_flags(task: str) -> list[str]:
    if task in GLUE:
        return ["--task", task, "--data-dir", str(DATA / "glue")]
    return ["--train-file", str(DATA / "tasks" / task / "train.jsonl"),
            "--validation-file", str(DATA / "tasks" / task / "validation.jsonl")]


def search(task: str, seed: int, arm: str, budget: str, args, scratch: Path) -> dict:
    """Run (or resume) one arm's search; its row."""
    name = f"{task}-s{seed}-b{budget}-{arm}"
    out, storage = scratch / "studies" / name, f"sqlite:///{scratch / 'studies' / 'studies.db'}"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "autopelt.cli", "search", *task_flags(task), "--k", str(args.k),
               "--seed", str(seed), "--budget", budget, "--workers", "1", "--sampler", arm,
               *(["--cpus-per-trial", str(args.cpus_per_trial)] if args.cpus_per_trial else []),
               "--portfolio", portfolio_for(task, scratch), "--storage", storage, "--study-name", name,
               "--out", str(out)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    (out / "search.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return {"seconds": round(time.monotonic() - started), **read_study(storage, name)}


def read_study(storage: str, name: str) -> dict:
    """The answer, the ensemble (its test scored after every choice) and the trials by phase of a finished study."""
    from autopelt.ensemble.study import of_study, with_test
    from autopelt.study import answers
    from autopelt.study.info import floors_of, read_study as study_info
    from autopelt.study.record import read_all
    from autopelt.study.storage import load_study

    study = load_study(storage, name, storage)
    records = read_all(study)
    best = answers.best(records)
    metric = study_info(study).metric or "accuracy"
    phases = Counter(_phase(r) for r in records if r.state.name in ("COMPLETE", "PRUNED"))
    row = {"metric": metric, "single_dev": best.dev_value, "single_test": best.test_value(metric),
           "single": best.label, "phases": dict(phases), "floors": floors_of(study)}
    chosen = of_study(study)
    if chosen is not None and len(chosen.members) > 1:
        chosen = with_test(chosen)
        row.update(ensemble_test=chosen.test, ensemble_members=len(chosen.members), ensemble_answers=chosen.answers)
    row["taken_test"] = row["ensemble_test"] if row.get("ensemble_answers") else row["single_test"]
    return row


def _phase(record) -> str:
    phase = record.phase
    return "portfolio" if phase.startswith("portfolio #") and "lr" not in phase else \
        "leaders" if phase.startswith("portfolio #") else "finalist" if phase.endswith("again") else \
        "baseline" if phase.startswith("baseline") else phase


def run(args) -> None:
    """Every cell not in rows.jsonl yet, `--jobs` searches at once (each on --cpus-per-trial cores)."""
    work, scratch = Path(args.work), Path(args.scratch)
    work.mkdir(parents=True, exist_ok=True)
    rows_file, lock = work / "rows.jsonl", threading.Lock()
    done = {json.loads(line)["key"] for line in rows_file.read_text().splitlines()} if rows_file.is_file() else set()
    cells = [(budget, seed, task, arm) for budget in args.budgets for seed in args.seeds
             for task in args.tasks.split(",") for arm in args.arms.split(",")]
    for task in args.tasks.split(","):
        portfolio_for(task, scratch)  # built once, before the searches that share it

    def one(cell) -> None:
        budget, seed, task, arm = cell
        key = f"{task}|k{args.k}|b{budget}|cpus{args.cpus_per_trial}|seed{seed}|{arm}"
        if key in done:
            return
        row = {"key": key, "task": task, "seed": seed, "k": args.k, "budget": budget, "arm": arm,
               "cpus_per_trial": args.cpus_per_trial, "jobs": args.jobs, "load_before": os.getloadavg()[0],
               **search(task, seed, arm, budget, args, scratch)}
        with lock, rows_file.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, cells))


def summarise(rows: list[dict]) -> list[dict]:
    """Per budget and arm: the mean test of the single answer, of the ensemble and of what is taken away, each
    paired against today's arm on the same (task, seed) (mean, std, worst), per task and over all; only on the
    (task, seed) cells where every arm ran."""
    table = []
    for budget in sorted({r["budget"] for r in rows}):
        cells = {(r["task"], r["seed"], r["arm"]): r for r in rows if r["budget"] == budget}
        whole = {(t, s) for t, s, _ in cells if all((t, s, arm) in cells for arm in ARMS)}  # every arm ran there
        for arm in ARMS:
            pairs = [(r, cells[(t, s, REFERENCE)]) for (t, s, a), r in cells.items() if a == arm and (t, s) in whole]
            if not pairs:
                continue
            for task in sorted({r["task"] for r, _ in pairs}) + ["mean"]:
                mine = [(r, ref) for r, ref in pairs if task in ("mean", r["task"])]
                entry = {"budget": budget, "arm": arm, "task": task, "runs": len(mine),
                         "seconds": round(statistics.fmean(r["seconds"] for r, _ in mine))}
                for form in ("single", "ensemble", "taken"):
                    values = [(r.get(f"{form}_test"), ref.get(f"{form}_test")) for r, ref in mine]
                    values = [(a, b) for a, b in values if a is not None and b is not None]
                    if not values:
                        continue
                    gains = [100 * (a - b) for a, b in values]
                    entry[f"{form}_test"] = round(statistics.fmean(100 * a for a, _ in values), 2)
                    entry[f"{form}_vs_tpe"] = round(statistics.fmean(gains), 2)
                    entry[f"{form}_vs_tpe_std"] = round(statistics.stdev(gains), 2) if len(gains) > 1 else 0.0
                    entry[f"{form}_vs_tpe_worst"] = round(min(gains), 2)
                table.append(entry)
    return table


def summary(args) -> None:
    rows_file = Path(args.work) / "rows.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.is_file() else []
    table = summarise(rows)
    for entry in table:
        print(json.dumps(entry))
    if table:
        columns = ["budget", "arm", "task", "runs", "single_test", "single_vs_tpe", "taken_test", "taken_vs_tpe",
                   "taken_vs_tpe_std", "taken_vs_tpe_worst", "seconds"]
        path = write_results("sampler-share", table, columns, settings={"runs": sorted(r["key"] for r in rows)},
                             notes="test in points; *_vs_tpe: paired difference to --sampler tpe (the default "
                                   "before these cells) on the same task, seed and budget; taken: the ensemble where it answers, else "
                                   "the single answer; seconds: a search's wall time, two searches at once on one "
                                   "core each", out_dir=Path(__file__).parent)
        print(f"wrote {path}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="run every arm's search (resumes)")
    go.add_argument("--tasks", default="trec,tweeteval_emotion,qnli")
    go.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    go.add_argument("--budgets", nargs="+", default=["10m"], help="each arm's --budget")
    go.add_argument("--arms", default=",".join(ARMS))
    go.add_argument("--k", type=int, default=500)
    go.add_argument("--jobs", type=int, default=1, help="searches at once")
    go.add_argument("--cpus-per-trial", type=int, help="each search's cores (default: the machine's)")
    go.add_argument("--work", default=str(DEFAULT_WORK))
    go.add_argument("--scratch", default=str(DEFAULT_SCRATCH))
    show = commands.add_parser("summary", help="the table, written to benchmarks/results/")
    show.add_argument("--work", default=str(DEFAULT_WORK))
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    run(args) if args.command == "run" else summary(args)


if __name__ == "__main__":
    main()
