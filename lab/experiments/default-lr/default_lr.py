"""Defaults that learn: each method's chosen learning rate (a trial given none) against a sweep of fixed rates.

For every method (a preset at its paper structure) and seed, one trial at each rate of the sweep and one trial
that chooses its own rate; the table gives test accuracy, mean over seeds, and whether the chosen rate lands
within the target of the sweep's best rate.

    python lab/experiments/default-lr/default_lr.py --data-dir ../shared/data/glue-full --work-dir /tmp/default-lr \\
        [--task sst2] [--k 1000] [--epochs 3] [--seeds 0,1,2] [--methods lora,adapter,...] [--jobs 2]

Each run writes its result.json under --work-dir; running the same command again skips the runs already there
(resume after an interruption), and says how many it reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SWEEP = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
METHODS = ("lora", "adapter", "prefix", "prompt", "bitfit", "compacter", "unipelt_apl")
TARGET_POINTS = 2.0
SNLI = ("--text-columns", "premise,hypothesis", "--label-column", "relation",
        "--label-names", "entailment,neutral,contradiction")


def run(args, method: str, lr: float | None, seed: int) -> tuple[dict, bool]:
    """(result of one trial, whether it was reused from --work-dir)."""
    out = Path(args.work_dir) / args.task / method / f"{'auto' if lr is None else f'{lr:g}'}-seed{seed}"
    if (out / "result.json").exists():
        return json.loads((out / "result.json").read_text()), True
    command = [sys.executable, "-m", "autopelt.cli", "train", "--task", args.task, "--data-dir", args.data_dir,
               "--k", str(args.k), "--epochs", str(args.epochs), "--preset", method, "--seed", str(seed),
               "--threads", str(args.threads), "--out", str(out)]
    command += ["--lr", f"{lr:g}"] if lr is not None else []
    command += list(SNLI) if args.task == "snli" else []
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if not (out / "result.json").exists():
        raise SystemExit(f"{method} lr {lr} seed {seed} wrote no result: {done.stderr.strip()[-500:]}")
    return json.loads((out / "result.json").read_text()), False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--rates", default="auto," + ",".join(f"{lr:g}" for lr in SWEEP),
                        help="what to run: auto (the trial chooses) and fixed rates; e.g. --rates auto for the "
                             "chosen rate alone")
    parser.add_argument("--jobs", type=int, default=2, help="trials at once")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per trial")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    rates = [None if r == "auto" else float(r) for r in args.rates.split(",")]
    runs = [(m, lr, s) for s in seeds for m in methods for lr in rates]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda job: run(args, *job), runs))
    results = {job: result for job, (result, _) in zip(runs, done)}
    reused = sum(was_reused for _, was_reused in done)
    print(f"{args.task} K={args.k} · {args.epochs} epochs · seeds {args.seeds} · {len(runs)} trials "
          f"({reused} reused from {args.work_dir})\n")
    rows = _print_table(results, methods, seeds, [lr for lr in rates if lr is not None])
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # bench/results.py
    from results import write_results

    write_results(f"default-lr-{args.task}", rows, settings={"task": args.task, "k": args.k, "epochs": args.epochs,
                                                            "seeds": seeds})


def _accuracy(result: dict) -> float:
    if result["status"] != "ok":
        return float("nan")
    return 100 * result["test"][result["metric"]]


def _print_table(results: dict, methods: list[str], seeds: list[int], grid: list[float]) -> list[dict]:
    """Mean test accuracy at each fixed rate, and of the chosen rate (with its spread) against the best of them;
    returns the table's rows."""
    rows = []
    header = "".join(f" lr {lr:g} |" for lr in grid)
    print(f"| method |{header} chosen lr (per seed) | chosen: test | best of sweep | gap | target |")
    print("|---|" + "---:|" * len(grid) + "---|---:|---|---:|---|")
    for method in methods:
        sweep = {lr: statistics.mean(_accuracy(results[(method, lr, s)]) for s in seeds) for lr in grid}
        cells = "".join(f" {sweep[lr]:.1f} |" for lr in grid)
        chosen = [results[(method, None, s)] for s in seeds if (method, None, s) in results]
        if not chosen:  # --rates without auto: the fixed rates only
            print(f"| {method} |{cells} – | – | – | – | – |")
            rows.append({"method": method, **{f"lr {lr:g}": sweep[lr] for lr in grid}})
            continue
        accuracies = [_accuracy(r) for r in chosen if r["status"] == "ok"]  # a failed trial has no accuracy
        accuracy = statistics.mean(accuracies) if accuracies else float("nan")
        spread = f" ± {statistics.stdev(accuracies):.1f}" if len(accuracies) > 1 else ""
        spread += f" ({len(chosen) - len(accuracies)} failed)" if len(accuracies) < len(chosen) else ""
        rates = ", ".join(f"{r['learning_rate']:.2g}" if r.get("learning_rate") else "failed" for r in chosen)
        seconds = statistics.mean((r.get("lr_choice") or {}).get("seconds", 0.0) for r in chosen)
        if sweep:
            best_lr = max(sweep, key=sweep.get)
            gap = sweep[best_lr] - accuracy
            verdict = "met" if gap <= TARGET_POINTS else "MISSED"
            against = f"{sweep[best_lr]:.1f} (lr {best_lr:g}) | {gap:+.1f} | within {TARGET_POINTS:g}: {verdict}"
        else:
            against = "– | – | –"
        print(f"| {method} |{cells} {rates} ({seconds:.0f} s) | {accuracy:.1f}{spread} | {against} |")
        rows.append({"method": method, **{f"lr {lr:g}": sweep[lr] for lr in grid}, "chosen lr": rates,
                     "chosen: test": accuracy, "target": against.rsplit("|", 1)[-1].strip()})
    return rows


if __name__ == "__main__":
    main()
