"""Search strategies at equal compute on real data (issue 4): Optuna TPE + ASHA vs random search vs TPE without
early stopping. Each strategy gets the same wall-time budget on the same task, protocol, space and seed; the
script runs `autopelt search` once per strategy (in a subprocess, as a user would), then reads the studies.

It prints, per strategy: the best dev metric against cumulative training seconds, the test metric of its pick,
the trials it ran (complete / stopped early), and the controller's overhead between trials.

Usage: python bench/search_strategies.py --data-dir ../shared/data/glue [--task rte --k 1000]
       [--minutes 12] [--epochs 3] [--space default] [--baselines]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = {  # name -> extra `autopelt search` flags
    "tpe+asha": ["--sampler", "tpe"],
    "random": ["--sampler", "random", "--no-early-stopping"],
    "tpe-no-early-stopping": ["--sampler", "tpe", "--no-early-stopping"],
}


def run_strategy(name: str, flags: list[str], args, storage: str, out: Path) -> None:
    command = [sys.executable, "-m", "autopelt.cli", "search", "--task", args.task, "--data-dir", args.data_dir,
               "--epochs", str(args.epochs), "--space", args.space, "--budget", f"{args.minutes}m",
               "--storage", storage, "--study-name", _study(name), "--out", str(out / _study(name)),
               "--seed", str(args.seed), *flags]
    if args.k:
        command += ["--k", str(args.k)]
    if not args.baselines:
        command.append("--no-baselines")
    print(f"$ {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL if not args.verbose else None)


def _study(name: str) -> str:
    return "bench-" + name.replace("+", "-")


def summarise(name: str, storage: str) -> dict:
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=_study(name), storage=storage)
    finished = sorted((t for t in study.trials if t.datetime_complete), key=lambda t: t.datetime_complete)
    curve, spent, best = [], 0.0, None
    for trial in finished:
        spent += (trial.datetime_complete - trial.datetime_start).total_seconds()
        if trial.state == TrialState.COMPLETE and (best is None or trial.values[0] > best.values[0]):
            best = trial
        curve.append((spent, best.values[0] if best else None))
    gaps = [(b.datetime_start - a.datetime_complete).total_seconds() for a, b in zip(finished, finished[1:])]
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in finished]
    states = [t.state for t in finished]
    return {
        "name": name, "curve": curve, "best": best,
        "complete": states.count(TrialState.COMPLETE), "pruned": states.count(TrialState.PRUNED),
        "failed": states.count(TrialState.FAIL),
        "overhead": statistics.fmean(gaps) if gaps else 0.0,
        "trial_seconds": statistics.fmean(durations) if durations else 0.0,
    }


def print_summary(rows: list[dict], metric: str) -> None:
    print()
    print(f"| strategy | trials (complete / stopped early / failed) | best dev {metric} | its test {metric} | "
          "its delta | overhead between trials |")
    print("|---|---|---:|---:|---|---:|")
    for row in rows:
        best = row["best"]
        dev = f"{best.values[0]:.4f}" if best else "–"
        test = best.user_attrs.get("test", {}).get(metric) if best else None
        share = 100 * row["overhead"] / row["trial_seconds"] if row["trial_seconds"] else 0.0
        print(f"| {row['name']} | {row['complete']} / {row['pruned']} / {row['failed']} | {dev} | "
              f"{'–' if test is None else f'{test:.4f}'} | {best.user_attrs.get('summary', '') if best else '–'} | "
              f"{row['overhead']:.2f} s ({share:.2f}% of a trial) |")
    print()
    print("best dev so far against cumulative training seconds (each strategy's finished trials in order):")
    for row in rows:
        points = ", ".join(f"{s:.0f}s→{b:.3f}" if b is not None else f"{s:.0f}s→–" for s, b in row["curve"])
        print(f"  {row['name']}: {points}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="rte")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=12, help="wall-time budget of each strategy")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--space", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baselines", action="store_true", help="run the baselines in every strategy's study")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--verbose", action="store_true", help="show each search's own output")
    parser.add_argument("--work-dir", help="keep the studies and trial outputs here (default: a new temp folder)")
    args = parser.parse_args()
    from autopelt.data import get_task

    names = args.strategies.split(",")
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategy {unknown[0]!r}; strategies: {', '.join(STRATEGIES)}")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="autopelt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{work / 'bench.db'}"
    print(f"studies in {storage}", flush=True)  # kept: a failed run can still be read
    for name in names:
        run_strategy(name, STRATEGIES[name], args, storage, work)
    print(f"{args.task} · K={args.k} · space {args.space} · {args.epochs} epochs per trial · "
          f"{args.minutes} min per strategy · seed {args.seed}")
    print_summary([summarise(name, storage) for name in names], get_task(args.task).metric)


if __name__ == "__main__":
    main()
