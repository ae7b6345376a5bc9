"""A whole default search before and after a change: its wall time, and its answer's test accuracy over seeds.

Runs `autopelt search` with its defaults (task, K, trial budget, workers as given; nothing else set) from two
checkouts of autopelt, one after the other on this machine: --before (a commit, checked out as a git worktree under
--work-dir) and this checkout. Each study's answer is then exported with `autopelt export --reseed N` by the same
checkout's code: the answer retrained at seeds 0..N-1, each a new draw of K rows, as a user of that version gets it.
Prints and writes (`search-before-after`): per side the wall seconds, the trials, the answer, and its test accuracy
mean, standard deviation and worst seed; and after/before wall time. A side whose study or export finished before
is kept (resumable).

    python lab/experiments/search-before-after/search_before_after.py --data-dir ../shared/data/glue-full --task sst2 --work-dir /tmp/before-after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"
BEFORE = "af0781d"  # the last commit before backbone dropout off, attention by measurement and the portfolio


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from results import write_results

    work = Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    before = checkout(args.before, work / "before-src")
    rows = [side(args, "before", before, work), side(args, "after", ROOT, work)]
    ratio = rows[0]["wall_s"] / rows[1]["wall_s"]
    for row in rows:
        print(f"{row['side']:>6}: {row['wall_s']:.0f} s, {row['trials']} trials, answer {row['answer']} at "
              f"{row['lr']}: test {row['test_mean']:.1f} ± {row['test_std']:.1f} (worst {row['test_min']:.1f}) "
              f"over {args.seeds} seeds")
    delta = rows[1]["test_mean"] - rows[0]["test_mean"]
    print(f"after is {ratio:.2f}x as fast (target >= 1.8x), answer {delta:+.1f} points (target within 0.5 or better)")
    write_results("search-before-after", rows, settings={
        "task": args.task, "k": args.k, "budget": args.budget, "workers": args.workers, "seeds": args.seeds,
        "before": args.before}, notes=f"after/before speed {ratio:.2f}x; answer test Δ {delta:+.2f} points")


def checkout(commit: str, folder: Path) -> Path:
    if not (folder / "autopelt").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit], check=True)
    return folder


def side(args, name: str, source: Path, work: Path) -> dict:
    """One side's search (timed) and its answer's export with re-seeds, each kept once done."""
    here = work / name
    here.mkdir(exist_ok=True)
    storage = f"sqlite:///{here / 'study.db'}"
    env = {**os.environ, "PYTHONPATH": str(source), "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = here / "search.done"
    if not done.exists():
        command = [sys.executable, "-m", "autopelt.cli", "search", "--task", args.task, "--data-dir", args.data_dir,
                   "--k", str(args.k), "--budget", str(args.budget), "--storage", storage, "--study-name", "default",
                   "--out", str(here / "out"), "--workers", str(args.workers), "--seed", str(args.seed)]
        print(f"{name}: $ {' '.join(command[2:])}  (from {source})", flush=True)
        started = time.perf_counter()
        subprocess.run(command, cwd=source, env=env, check=True, stdout=subprocess.DEVNULL)
        done.write_text(f"{time.perf_counter() - started:.1f}")
    export = here / "export"
    if not (export / "metrics.json").exists():
        command = [sys.executable, "-m", "autopelt.cli", "export", "--storage", storage, "--study", "default",
                   "--out", str(export), "--reseed", str(args.seeds)]
        print(f"{name}: $ {' '.join(command[2:])}", flush=True)
        subprocess.run(command, cwd=source, env=env, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads((export / "metrics.json").read_text())
    settings = json.loads((export / "training.json").read_text())
    tests = [100 * run["test"]["accuracy"] for run in metrics["reseed"]["runs"]]
    return {"side": name, "source": args.before if name == "before" else "this checkout",
            "wall_s": float(done.read_text()), "trials": trials_of(storage),
            "answer": metrics.get("baseline") or f"trial {metrics['trial']}", "delta": summary_of(settings["spec"]),
            "batch": settings.get("batch_size"), "backbone_dropout": settings.get("backbone_dropout", "model"),
            "lr": settings.get("learning_rate") or "swept at each seed",  # None: the trial chose it by a sweep
            "test_mean": statistics.fmean(tests), "test_std": statistics.stdev(tests), "test_min": min(tests)}


def summary_of(spec: dict) -> str:
    from autopelt.delta import parse_spec

    return parse_spec(spec).summary()


def trials_of(storage: str) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return len(optuna.load_study(study_name="default", storage=storage).trials)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--budget", default="20", help="the search's --budget (default: 20 trials)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5, help="re-seeds of each answer (autopelt export --reseed)")
    parser.add_argument("--before", default=BEFORE, help=f"the commit to compare with (default {BEFORE})")
    parser.add_argument("--work-dir", required=True)
    return parser.parse_args()


if __name__ == "__main__":
    main()
