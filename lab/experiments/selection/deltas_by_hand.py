"""Deltas trained by hand over seeds, on a study's rows, against a reference's re-runs on the same rows and seeds.

Does a delta better than the study's answer exist at all? This trains each candidate (a spec or preset, a
learning rate, a batch size) with training seeds 1..S (or S seeds from --first-seed), on the rows and everything
else of an earlier run (`--like`: a result.json, e.g. one of `bench/search_value.py`'s re-runs, which train on
the study's rows, data seed 0), and prints each one's dev and test mean and the test difference paired by seed
against a reference (`--against`: a folder of seed-N/result.json, e.g. tuned LoRA's re-runs).

    python lab/experiments/selection/deltas_by_hand.py --like /work/benchwork/value-snli-3/reruns/baseline-lora/seed-1/result.json \
        --against /work/benchwork/value-snli-3/reruns/tuned-lora-pick --seeds 5 --work-dir /work/benchwork/snli-hand \
        --candidate 'lora b16=lora@4e-3/16' --candidate 'houlsby=houlsby@3e-3' --candidate 'lora mean=mean:lora@5.5e-3'

A candidate is NAME=[POOLING:]DELTA@LR[/BATCH], DELTA a preset name or a spec file, POOLING the head's (`mean`:
the mean of the token states; left out, the spec's own). A run that finished before in the work dir is read back,
not trained again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def parse_candidate(text: str) -> dict:
    """NAME=[POOLING:]DELTA@LR[/BATCH] -> {"name", "spec", "lr", "batch_size" (None: the --like run's)}."""
    from autopelt.delta import parse_spec
    from autopelt.delta.presets import PRESETS
    from autopelt.delta.spec import POOLINGS

    try:
        name, rest = text.split("=", 1)
        delta, rate = rest.rsplit("@", 1)
        lr, _, batch = rate.partition("/")
        lr, batch = float(lr), int(batch) if batch else None
    except ValueError:
        raise SystemExit(f"bad --candidate {text!r}: write NAME=[POOLING:]DELTA@LR[/BATCH], "
                         "e.g. 'lora b16=lora@4e-3/16' or 'lora mean=mean:lora@5.5e-3'")
    pooling = ""
    if ":" in delta and delta.split(":", 1)[0] in POOLINGS:  # mean:lora
        pooling, _, delta = delta.partition(":")
    if delta in PRESETS:
        spec = PRESETS[delta]
    elif Path(delta).is_file():
        spec = json.loads(Path(delta).read_text())
    else:
        raise SystemExit(f"bad --candidate {text!r}: {delta!r} is neither a preset nor a spec file")
    if pooling:
        spec = {**spec, "pooling": pooling}
    return {"name": name.strip(), "spec": parse_spec(spec).to_dict(), "lr": lr, "batch_size": batch}


def train(job: dict) -> dict:
    """One run's result: read back when it finished before (the same run: every setting but where it writes)."""
    from autopelt.train import TrialSettings, run_trial
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from search_value import run_key  # bench/search_value.py

    settings = TrialSettings.from_dict(job)
    done = Path(job["out_dir"]) / "result.json"
    if done.exists():
        result = json.loads(done.read_text())
        if run_key(result.get("settings", {})) != run_key(settings.to_dict()):
            raise SystemExit(f"{done} is another run than this candidate's: use another --work-dir or name")
        return result
    return run_trial(settings)


def scores(result: dict) -> tuple[float, float]:
    if result.get("status") != "ok":
        raise SystemExit(f"a run failed: {result.get('reason')}")
    metric = result["metric"]
    return 100 * result["dev"][metric], 100 * result["test"][metric]


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f}" + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--like", required=True, help="a result.json whose settings (task, rows, model, epochs, "
                                                      "data seed, ...) every run shares")
    parser.add_argument("--against", help="a folder of seed-N/result.json to pair each candidate's seeds with")
    parser.add_argument("--candidate", action="append", required=True, help="NAME=[POOLING:]DELTA@LR[/BATCH]")
    parser.add_argument("--seeds", type=int, default=5, help="how many training seeds: F..F+N-1")
    parser.add_argument("--first-seed", type=int, default=1, help="F (11 for a study run with --seed 10, whose "
                                                                  "re-runs train with seeds 11-15)")
    parser.add_argument("--epochs", type=int, help="train every candidate this many epochs (default: the --like "
                                                   "run's)")
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results-name", help="also write the table as benchmarks/results/NAME-<date>.json")
    args = parser.parse_args(argv)

    like = Path(args.like)
    if not like.is_file():
        raise SystemExit(f"--like {like} is not a file: give a result.json of an earlier run")
    base = json.loads(like.read_text())["settings"]
    if base.get("data_seed") is None:
        raise SystemExit(f"--like {like} drew its rows with its training seed (no data_seed): give a run on a "
                         "study's rows, e.g. a re-run of bench/search_value.py")
    if args.epochs is not None and args.epochs < 1:
        raise SystemExit(f"--epochs {args.epochs}: give a whole number of epochs, at least 1")
    if args.epochs:
        base = {**base, "epochs": args.epochs, "max_steps": None}
    candidates = [parse_candidate(text) for text in args.candidate]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [{**base, "spec": c["spec"], "learning_rate": c["lr"], "batch_size": c["batch_size"] or base["batch_size"],
             "seed": seed, "out_dir": str(Path(args.work_dir) / c["name"].replace(" ", "-") / f"seed-{seed}")}
            for c in candidates for seed in seeds]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(train, jobs))

    reference = {}
    if args.against:
        for seed in seeds:
            path = Path(args.against) / f"seed-{seed}" / "result.json"
            if path.is_file():
                reference[seed] = scores(json.loads(path.read_text()))[1]
    print(f"{base['task']} · K={base['protocol']} · {base['epochs']} epochs · data seed {base['data_seed']} · "
          f"seeds {seeds[0]}-{seeds[-1]}" + (f" · paired against {args.against}" if args.against else ""))
    print()
    print("| delta | lr | batch | dev | test mean ± std | per seed | paired Δ |")
    print("|---|---:|---:|---:|---:|---|---:|")
    rows = []
    for i, c in enumerate(candidates):
        runs = [scores(r) for r in results[i * len(seeds):(i + 1) * len(seeds)]]
        tests = [test for _, test in runs]
        paired = [test - reference[seed] for seed, test in zip(seeds, tests) if seed in reference]
        delta = mean_std(paired) if paired else "–"
        print(f"| {c['name']} | {c['lr']:g} | {jobs[i * len(seeds)]['batch_size']} | "
              f"{statistics.mean(d for d, _ in runs):.1f} | {mean_std(tests)} | "
              f"{', '.join(f'{t:.1f}' for t in tests)} | {delta} |")
        rows.append({"delta": c["name"], "lr": c["lr"], "batch": jobs[i * len(seeds)]["batch_size"],
                     "dev": statistics.mean(d for d, _ in runs), "test mean ± std": mean_std(tests),
                     "per seed": tests, "paired Δ": delta})
    if args.results_name:
        sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # bench/results.py
        from results import write_results

        write_results(args.results_name, rows, precision=results[0].get("precision") if results else None,
                      settings={"like": args.like, "against": args.against, "seeds": seeds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
