"""Search strategies at equal compute on real data: Optuna TPE + ASHA vs random search vs TPE without
early stopping. Each strategy gets the same wall-time budget on the same task, protocol, space and seed; the
script runs `autopelt search` once per strategy (in a subprocess, as a user would), then reads the studies.

It prints, per strategy: the best dev metric against cumulative training seconds, the test metric of its pick,
the trials it ran (complete / stopped by ASHA / stopped by the time budget / failed), and the controller's
overhead between trials. With --baselines, the baselines (UniPELT(APL) and each single method at paper
defaults) then run in the first strategy's study, after its search so no sampler sees them, on the same
rows, seed and epochs; the script prints where each strategy's pick stands against them.

Usage: python lab/experiments/search-strategies/search_strategies.py --data-dir ../shared/data/glue [--task rte --k 1000]
       [--minutes 12] [--epochs 3] [--space default] [--baselines]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

STRATEGIES = {  # name -> extra `autopelt search` flags
    "tpe+asha": ["--sampler", "tpe"],
    "random": ["--sampler", "random", "--no-early-stopping"],
    "tpe-no-early-stopping": ["--sampler", "tpe", "--no-early-stopping"],
}


def run_search(name: str, flags: list[str], budget: str, args, storage: str, out: Path) -> None:
    command = [sys.executable, "-m", "autopelt.cli", "search", "--task", args.task, "--data-dir", args.data_dir,
               "--epochs", str(args.epochs), "--space", args.space, "--budget", budget,
               "--storage", storage, "--study-name", _study(name), "--out", str(out / _study(name)),
               "--seed", str(args.seed), *flags]
    if args.k:
        command += ["--k", str(args.k)]
    print(f"$ {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL if not args.verbose else None)


def run_baselines(name: str, args, storage: str, out: Path) -> datetime:
    """Queue and run the baselines in `name`'s study; returns when that phase began (the search's end).

    The trial budget counts a study's live trials (not failed), so it is those plus the baselines. A trial
    the deadline cut in its first epoch was queued again; it runs here too, and is not the strategy's.
    """
    import optuna
    from optuna.trial import TrialState

    from autopelt.delta.presets import BASELINES

    study = optuna.load_study(study_name=_study(name), storage=storage)
    live = sum(t.state != TrialState.FAIL for t in study.trials)
    began = datetime.now()  # Optuna's timestamps are local and naive too
    run_search(name, STRATEGIES[name], str(live + len(BASELINES)), args, storage, out)
    return began


def _study(name: str) -> str:
    return "bench-" + name.replace("+", "-")


def summarise(name: str, storage: str, search_ended: datetime | None = None) -> dict:
    import optuna
    from optuna.trial import TrialState

    from autopelt.study import answers
    from autopelt.study.record import CUT_BY_DEADLINE, read

    study = optuna.load_study(study_name=_study(name), storage=storage)
    records = {t.number: read(t) for t in study.trials}
    baselines = {r.baseline: r for r in records.values() if r.baseline and r.state == TrialState.COMPLETE}
    # the search's own trials: not the baselines, nor anything that started after the search's budget
    finished = sorted((t for t in study.trials if t.datetime_complete and not records[t.number].baseline
                       and (search_ended is None or t.datetime_start < search_ended)),
                      key=lambda t: t.datetime_complete)
    curve, spent, best_value = [], 0.0, None
    for trial in finished:
        spent += (trial.datetime_complete - trial.datetime_start).total_seconds()
        if trial.state == TrialState.COMPLETE and (best_value is None or trial.values[0] > best_value):
            best_value = trial.values[0]
        curve.append((spent, best_value))
    best = answers.best([records[t.number] for t in finished])  # the study's rule: ties go to the smaller delta
    gaps = [(b.datetime_start - a.datetime_complete).total_seconds() for a, b in zip(finished, finished[1:])]
    durations = [(t.datetime_complete - t.datetime_start).total_seconds() for t in finished]
    states = [t.state for t in finished]
    timed_out = sum(records[t.number].stopped_by in CUT_BY_DEADLINE for t in finished)
    cut = sum(records[t.number].fail_reason == "interrupted" for t in finished)  # by the deadline, in epoch 1
    return {
        "name": name, "curve": curve, "best": best, "baselines": baselines, "spent": spent,
        "complete": states.count(TrialState.COMPLETE), "asha": states.count(TrialState.PRUNED) - timed_out,
        "timed_out": timed_out + cut, "failed": states.count(TrialState.FAIL) - cut,
        "overhead": statistics.fmean(gaps) if gaps else 0.0,
        "trial_seconds": statistics.fmean(durations) if durations else 0.0,
    }


def print_summary(rows: list[dict], metric: str) -> None:
    print()
    print(f"| strategy | trials (complete / stopped by ASHA / by the time budget / failed) | trial seconds | "
          f"best dev {metric} | its test {metric} | its delta | overhead between trials |")
    print("|---|---|---:|---:|---:|---|---:|")
    for row in rows:
        best = row["best"]
        dev = f"{best.values[0]:.4f}" if best else "–"
        share = 100 * row["overhead"] / row["trial_seconds"] if row["trial_seconds"] else 0.0
        print(f"| {row['name']} | {row['complete']} / {row['asha']} / {row['timed_out']} / {row['failed']} | "
              f"{row['spent']:.0f} | {dev} | "
              f"{_test(best, metric) if best else '–'} | {(best.summary or '') if best else '–'} | "
              f"{row['overhead']:.2f} s ({share:.2f}% of a trial) |")
    print()
    print("best dev so far against cumulative training seconds (each strategy's finished trials in order):")
    for row in rows:
        points = ", ".join(f"{s:.0f}s→{b:.3f}" if b is not None else f"{s:.0f}s→–" for s, b in row["curve"])
        print(f"  {row['name']}: {points}")
    with_baselines = [row for row in rows if row["baselines"]]
    if with_baselines:
        print_baselines(with_baselines[0], rows, metric)


def print_baselines(host: dict, rows: list[dict], metric: str) -> None:
    baselines = host["baselines"]
    print()
    print(f"baselines in the {host['name']} study (same rows, seed and epochs; run after its search):")
    print(f"| baseline | params % | dev {metric} | test {metric} |")
    print("|---|---:|---:|---:|")
    for name, trial in sorted(baselines.items(), key=lambda item: -item[1].values[0]):
        pct = trial.params_pct if trial.params_pct is not None else float("nan")
        print(f"| {name} | {pct:.3f} | {trial.values[0]:.4f} | {_test(trial, metric)} |")
    unipelt = baselines.get("unipelt_apl")
    singles = [t for name, t in baselines.items() if not name.startswith("unipelt")]
    single = max(singles, key=lambda t: t.values[0]) if singles else None
    for row in rows:
        pick = row["best"]
        if pick is None:
            continue
        line = f"{row['name']} pick: dev {pick.values[0]:.4f} / test {_test(pick, metric)}"
        if unipelt:
            line += f"; UniPELT(APL) dev {unipelt.values[0]:.4f} / test {_test(unipelt, metric)}"
        if single:
            line += (f"; best single default ({single.baseline}) dev {single.values[0]:.4f} / "
                     f"test {_test(single, metric)}")
        print(line)


def _test(trial, metric: str) -> str:
    value = trial.test_value(metric)
    return "–" if value is None else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="rte")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=12, help="wall-time budget of each strategy")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--space", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baselines", action="store_true",
                        help="after the searches, run the baselines in the first strategy's study")
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
        run_search(name, [*STRATEGIES[name], "--no-baselines"], f"{args.minutes}m", args, storage, work)
    ended = {names[0]: run_baselines(names[0], args, storage, work)} if args.baselines else {}
    print(f"{args.task} · K={args.k} · space {args.space} · {args.epochs} epochs per trial · "
          f"{args.minutes} min per strategy · seed {args.seed}")
    rows = [summarise(name, storage, ended.get(name)) for name in names]
    print_summary(rows, get_task(args.task).metric)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # bench/results.py
    from results import write_results

    write_results(f"search-strategies-{args.task}", [
        {"strategy": r["name"], "complete": r["complete"], "stopped by ASHA": r["asha"],
         "stopped by the deadline": r["timed_out"], "failed": r["failed"], "trial seconds": r["spent"],
         "best dev": r["best"].values[0] if r["best"] else None, "overhead s": r["overhead"]} for r in rows],
        settings={"task": args.task, "k": args.k, "space": args.space, "epochs": args.epochs,
                  "minutes": args.minutes, "seed": args.seed})


if __name__ == "__main__":
    main()
