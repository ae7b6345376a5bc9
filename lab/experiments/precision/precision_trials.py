"""Same quality, less time? Whole trials in fp32 and in bf16, side by side: test accuracy (mean over seeds) and
wall time per trial, against the targets of the precision work (bf16 within 1 point of fp32, ≤ 0.55× its time).

    python lab/experiments/precision/precision_trials.py --data-dir ../shared/data/glue-full [--seeds 0,1,2] [--methods lora,unipelt_apl]

Trials run one after another, fp32 and bf16 alternating, so background load falls on both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from autopelt import delta
from autopelt.train import TrialSettings, run_trial
from autopelt.train import device as devices

ACCURACY_POINTS, TIME_RATIO = 1.0, 0.55


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--methods", default="lora,unipelt_apl", help="presets (autopelt methods)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    seeds = [int(s) for s in args.seeds.split(",")]
    methods, precisions = args.methods.split(","), args.precisions.split(",")
    runs: dict[tuple[str, str], list[dict]] = {(m, p): [] for m in methods for p in precisions}
    for seed in seeds:
        for method in methods:
            for precision in precisions:
                settings = TrialSettings(task=args.task, spec=delta.PRESETS[method], data_dir=args.data_dir,
                                         protocol=args.k, epochs=args.epochs, learning_rate=args.lr, seed=seed,
                                         precision=precision, threads=args.threads)
                result = run_trial(settings)
                if result["status"] != "ok":
                    raise SystemExit(f"{method} {precision} seed {seed} failed: {result['reason']}")
                runs[(method, precision)].append(result)
                print(f"# {method} {precision} seed {seed}: test {result['test'][result['metric']]:.4f}, "
                      f"{result['total_seconds']:.1f} s", flush=True)
    rows = _print_table(runs, methods, precisions, args)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # bench/results.py
    from results import write_results

    write_results("precision-trials", rows, settings={"task": args.task, "k": args.k, "epochs": args.epochs,
                                                      "lr": args.lr, "seeds": args.seeds, "threads": args.threads},
                  notes=devices.cpu_precision_note())


def _print_table(runs: dict, methods: list[str], precisions: list[str], args) -> list[dict]:
    """Print the table; return its rows (test accuracy in points, seconds per trial)."""
    rows = []
    print(f"\n{args.task} K={args.k} · {args.epochs} epochs · lr {args.lr:g} · seeds {args.seeds} · "
          f"{args.threads} threads · {devices.cpu_precision_note()}\n")
    print("| delta | precision | test accuracy (mean ± std) | wall s per trial | × fp32 time | Δ accuracy | target |")
    print("|---|---|---:|---:|---:|---:|---|")
    for method in methods:
        base = runs.get((method, "fp32"))
        for precision in precisions:
            results = runs[(method, precision)]
            accuracy = [100 * r["test"][r["metric"]] for r in results]
            seconds = statistics.mean(r["total_seconds"] for r in results)
            ratio = delta_points = target = ""
            if base and precision != "fp32":
                base_seconds = statistics.mean(r["total_seconds"] for r in base)
                base_accuracy = statistics.mean(100 * r["test"][r["metric"]] for r in base)
                ratio = f"{seconds / base_seconds:.2f}"
                delta_points = f"{statistics.mean(accuracy) - base_accuracy:+.1f}"
                same = abs(statistics.mean(accuracy) - base_accuracy) <= ACCURACY_POINTS
                fast = seconds / base_seconds <= TIME_RATIO
                target = (f"accuracy within {ACCURACY_POINTS:g}: {'met' if same else 'MISSED'}; "
                          f"≤ {TIME_RATIO}× time: {'met' if fast else 'MISSED'}")
            spread = f" ± {statistics.stdev(accuracy):.1f}" if len(accuracy) > 1 else ""
            print(f"| {method} | {precision} | {statistics.mean(accuracy):.1f}{spread} | {seconds:.1f} | {ratio} | "
                  f"{delta_points} | {target} |")
            rows.append({"delta": method, "precision": precision, "test": statistics.mean(accuracy),
                         "test_std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
                         "seconds_per_trial": seconds, "x_fp32_time": float(ratio) if ratio else None,
                         "target": target or None})
    return rows


if __name__ == "__main__":
    main()
