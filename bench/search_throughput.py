"""Trials per hour of a default search, and where a trial's wall time goes.

Runs `autopelt search` as a user would (default space, TPE, ASHA, the baselines) on one task with a small trial
budget, times it from outside, then reads every trial's result.json: each trial's seconds split into data
(tokeniser and tokenisation), model load, the attention choice, building the delta, the learning-rate choice,
training, evaluation (dev and test), saving the delta, and the rest of the trial; a trial early stopping ended
leaves no result.json, so its seconds come from the study and count as training; and outside the trials, what
the search spends on its own (Ray and worker start-up, imports, the sampler, study writes): the workers' wall time
less the seconds their trials took. The overhead share is everything but the learning-rate sweep (which trains
and evaluates its candidates), training and evaluation, over the search's worker time.

The hand-over is what a trial spends before it trains: data, model, attention choice, building the delta. A
worker holds the model and rows between trials (autopelt/train/warm.py); `--warm both` runs the search twice,
holding and with AUTOPELT_WARM=0, and compares their hand-overs (`search-throughput-warm` results).

Usage: python bench/search_throughput.py --data-dir ../shared/data/glue-full --task sst2 --k 1000 --budget 4 \\
           --work-dir /tmp/throughput [--workers 1] [--cpus-per-trial 2] [--epochs 1] [--warm on|off|both] \\
           [-- extra search flags]
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

# the learning-rate sweep trains and evaluates its candidates; a trial ASHA stopped trained and evaluated until then
LEARNING = ("lr choice", "training", "evaluation", "stopped early")
PHASES = ("data", "model", "attention", "delta", "lr choice", "training", "evaluation", "save", "rest of the trial")


def trial_phases(result: dict) -> dict[str, float]:
    """One result.json's seconds per phase; they add up to its total_seconds."""
    recorded = result.get("phase_seconds") or {}
    phases = {"data": recorded.get("data", 0.0), "model": recorded.get("model", 0.0),
              "attention": recorded.get("attention", 0.0), "delta": recorded.get("delta", 0.0),
              "lr choice": (result.get("lr_choice") or {}).get("seconds", 0.0),
              "training": result.get("train_seconds") or 0.0, "evaluation": result.get("eval_seconds") or 0.0,
              "save": recorded.get("save", 0.0)}
    phases["rest of the trial"] = max(0.0, (result.get("total_seconds") or 0.0) - sum(phases.values()))
    return phases


def summarise(results: list[dict], wall: float, workers: int, stopped: list[float] = ()) -> dict:
    """Trials per hour and the seconds of every phase, summed over trials, with the search's own time. `stopped`:
    the seconds of the trials ASHA stopped (they leave no result.json; the study records their time), counted
    whole as training and evaluation."""
    totals = {name: sum(trial_phases(r)[name] for r in results) for name in PHASES}
    totals["stopped early"] = sum(stopped)
    trial_seconds = sum(r.get("total_seconds") or 0.0 for r in results) + sum(stopped)
    outside = max(0.0, wall * workers - trial_seconds)
    worker_time = max(wall * workers, trial_seconds)
    trials = len(results) + len(stopped)
    return {"trials": trials, "ok": sum(r.get("status") == "ok" for r in results), "stopped_early": len(stopped),
            "wall_seconds": wall, "workers": workers, "trials_per_hour": 3600 * trials / wall if wall else 0.0,
            "median_trial_seconds": statistics.median([r.get("total_seconds") or 0.0 for r in results]) if results
            else 0.0, "phase_seconds": totals, "outside_trials_seconds": outside,
            "overhead_share": (worker_time - sum(totals[name] for name in LEARNING)) / worker_time
            if worker_time else 0.0}


OVERHEAD = ("data", "model", "attention", "delta", "save", "rest of the trial")  # a trial's own, not learning
HAND_OVER = ("data", "model", "attention", "delta")  # before a trial trains: what a warm worker shortens


def hand_over(results: list[dict], summary: dict) -> dict:
    """The trials' hand-over (`results` in trial order): its seconds (in all, per trial, per trial after each
    worker's first, each phase), its share of the worker time, and how many trials found their model held
    (`warm`). A worker's first trial loads whether or not workers hold."""
    phases = {name: sum(trial_phases(r)[name] for r in results) for name in HAND_OVER}
    worker_time = max(summary["wall_seconds"] * summary["workers"], sum(summary["phase_seconds"].values()))
    seconds = sum(phases.values())
    later = [sum(trial_phases(r)[name] for name in HAND_OVER) for r in results[summary["workers"]:]]
    return {"trials": len(results), "warm_trials": sum(bool((r.get("warm") or {}).get("model")) for r in results),
            "hand_over_seconds": round(seconds, 2),
            "per_trial_seconds": round(seconds / len(results), 3) if results else 0.0,
            "per_later_trial_seconds": round(sum(later) / len(later), 3) if later else None,
            "share_pct": round(100 * seconds / worker_time, 2) if worker_time else 0.0,
            **{f"{name}_seconds": round(value, 2) for name, value in phases.items()},
            "trials_per_hour": round(summary["trials_per_hour"], 1)}


def study_records(database: Path) -> list:
    import optuna

    from autopelt.study.record import read_all

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return read_all(optuna.load_study(study_name="throughput", storage=f"sqlite:///{database}"))


def stopped_seconds(records: list) -> list[float]:
    """The seconds of each trial of the study that ASHA stopped (PRUNED), as the controller timed it."""
    from optuna.trial import TrialState

    return [r.seconds or 0.0 for r in records if r.state == TrialState.PRUNED]


def running_overhead(records: list, results: dict[int, dict]) -> float | None:
    """The overhead share of a trial once the study is running: for every trial with a result.json but the first,
    what the controller timed beyond the trial's own seconds (handing it to a worker, reporting) plus the trial's
    own non-learning phases, over the controller's seconds. Start-up and the end of the search are left out."""
    timed = sorted((r for r in records if r.number in results and r.seconds), key=lambda r: r.number)[1:]
    if not timed:
        return None
    overhead = sum(r.seconds - (results[r.number].get("total_seconds") or 0.0)
                   + sum(trial_phases(results[r.number])[name] for name in OVERHEAD) for r in timed)
    return overhead / sum(r.seconds for r in timed)


def phase_rows(summary: dict) -> list[dict]:
    """The table's rows: each phase's seconds over all trials and its share of the worker time."""
    worker_time = max(summary["wall_seconds"] * summary["workers"], sum(summary["phase_seconds"].values()))
    rows = {**summary["phase_seconds"], "outside trials (start-up, sampler, study writes)":
            summary["outside_trials_seconds"]}
    return [{"where the time goes": name, "seconds": round(seconds, 1),
             "share_pct": round(100 * seconds / worker_time, 1) if worker_time else 0.0}
            for name, seconds in rows.items()]


def table(summary: dict) -> str:
    worker_time = max(summary["wall_seconds"] * summary["workers"], sum(summary["phase_seconds"].values()))
    lines = [f"{summary['trials']} trials ({summary['ok']} ok, {summary.get('stopped_early', 0)} stopped early) in "
             f"{summary['wall_seconds']:.0f} s on "
             f"{summary['workers']} worker(s): {summary['trials_per_hour']:.1f} trials per hour, median trial "
             f"{summary['median_trial_seconds']:.1f} s; overhead (all but the learning-rate sweep, training and "
             f"evaluation) "
             f"{100 * summary['overhead_share']:.1f}% of worker time", "",
             "| where the time goes | seconds | share of worker time |", "|---|---:|---:|"]
    rows = {**summary["phase_seconds"], "outside trials (start-up, sampler, study writes)":
            summary["outside_trials_seconds"]}
    for name, seconds in rows.items():
        lines.append(f"| {name} | {seconds:.1f} | {100 * seconds / worker_time:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--budget", default="4", help="trials (or wall time) of the search")
    parser.add_argument("--epochs", type=int, help="default: the space's")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cpus-per-trial", type=float)
    parser.add_argument("--model")
    parser.add_argument("--warm", choices=("on", "off", "both"), default="on",
                        help="workers hold the model and rows between trials (on), load them per trial (off), or "
                             "one search each way, compared (both)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="also write the summary and every trial's phases as JSON here")
    args, extra = parser.parse_known_args()
    if args.warm != "both":
        run(args, extra, args.work_dir, args.warm == "on", write=True)
        return
    runs = {mode: run(args, extra, args.work_dir / mode, mode == "on", write=False) for mode in ("on", "off")}
    rows = [{"warm": mode, **hand_over(results, summary)} for mode, (summary, results) in runs.items()]
    print("\n".join(f"warm {row['warm']}: hand-over {row['hand_over_seconds']} s over {row['trials']} trials "
                    f"({row['per_trial_seconds']} s a trial, {row['per_later_trial_seconds']} s after a worker's "
                    f"first; {row['share_pct']}% of worker time; data "
                    f"{row['data_seconds']} s, model {row['model_seconds']} s), {row['warm_trials']} warm"
                    for row in rows))
    from results import write_results  # bench/results.py, beside this script

    precision = ", ".join(sorted({r["precision"] for _, results in runs.values() for r in results
                                  if r.get("precision")})) or None
    print(write_results("search-throughput-warm", rows, precision=precision,
                        notes="the same search twice: workers holding the model and rows between trials (on) and "
                              "AUTOPELT_WARM=0 (off); hand-over = data, model, attention and delta phases",
                        settings={"task": args.task, "k": args.k, "budget": args.budget, "epochs": args.epochs,
                                  "workers": args.workers, "model": args.model}))


def run(args, extra: list[str], work_dir: Path, warm: bool, write: bool) -> tuple[dict, list[dict]]:
    """One search in `work_dir`, timed; its summary and its trials' results (written as `search-throughput` when
    `write`)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "autopelt.cli", "search", "--task", args.task, "--data-dir", args.data_dir,
               "--k", str(args.k), "--budget", args.budget, "--storage", f"sqlite:///{work_dir / 'study.db'}",
               "--study-name", "throughput", "--out", str(work_dir / "trials"), "--workers", str(args.workers)]
    for flag in ("epochs", "cpus_per_trial", "model"):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    command += [a for a in extra if a != "--"]
    print(f"$ {'' if warm else 'AUTOPELT_WARM=0 '}autopelt " + " ".join(command[3:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "AUTOPELT_WARM": "1" if warm
                                                                         else "0"})
    wall = time.perf_counter() - started
    by_number = {int(p.parent.name.split("-")[-1]): json.loads(p.read_text())
                 for p in sorted((work_dir / "trials").glob("trial-*/result.json"))}
    results = list(by_number.values())
    records = study_records(work_dir / "study.db")
    summary = summarise(results, wall, args.workers, stopped_seconds(records))
    summary["running_overhead_share"] = running_overhead(records, by_number)
    summary["warm"] = hand_over(results, summary)
    print(table(summary))
    if summary["running_overhead_share"] is not None:
        print(f"in a running study (every trial with a result but the first): overhead "
              f"{100 * summary['running_overhead_share']:.1f}% of a trial")
    if write:
        write_summary(args, command, summary, results)
    return summary, results


def write_summary(args, command: list[str], summary: dict, results: list[dict]) -> None:
    from results import write_results  # bench/results.py, beside this script

    precision = ", ".join(sorted({r["precision"] for r in results if r.get("precision")})) or None
    trials = "; ".join(f"{r.get('summary')} {r.get('total_seconds') or 0:.0f} s" for r in results)
    notes = (f"{summary['trials']} trials of `autopelt search`; overhead (all but the learning-rate sweep, training "
             f"and evaluation) {100 * summary['overhead_share']:.1f}% of worker time, start-up and the search's end "
             f"included; in a running study {100 * (summary['running_overhead_share'] or 0):.1f}% of a trial; "
             f"trials: {trials}")
    print(write_results("search-throughput", phase_rows(summary), precision=precision, notes=notes,
                        settings={k: v for k, v in summary.items() if k != "phase_seconds"}))
    if args.out:
        trials = [{"spec": r.get("summary"), "status": r.get("status"), "total_seconds": r.get("total_seconds"),
                   "phases": trial_phases(r)} for r in results]
        args.out.write_text(json.dumps({"command": command, "summary": summary, "trials": trials}, indent=1) + "\n")


if __name__ == "__main__":
    main()
