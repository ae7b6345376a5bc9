"""Trials per hour of packed trials (train/packed.py) against the same trials one by one.

Trains N classification trials of different methods at fixed rates (by default LoRA, (IA)3, a Pfeiffer adapter and
BitFit; 1 epoch; test not scored, as a search's trials) twice in this process, after an untimed warm-up step: one
after the other through `run_trial` (each loads its model and data, as a fresh worker would, from a warm file
cache), and as one pack through `run_packed` (one model, one data, one pass a step and a dev evaluation); mode
`measured` is that pack under `run_packed(measure=True)`, as `--pack auto` trains it: packed only where its measured
step pays (its row's `step_ratio`, packed / alone, and `unpacked`). For each: the wall seconds, trials per hour,
training examples per second over the wall time and over the training steps' time, and every trial's dev metric
(packing must not change them beyond rounding).

Usage: python bench/packed_throughput.py --data-dir ../shared/data/glue-full --task sst2 --k 1000 \\
           [--model all-MiniLM-L6-v2] [--threads 2] [--epochs 1 | --max-steps N] [--dev-size N]
           [--order alone,packed,measured] [--repeats N] [--out-dir DIR]

`speedup` is trials per hour over the one-by-one run of the same repeat; `train_speedup` the same for training
examples per second over the training steps' time alone (no model load, data or dev evaluation).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from autopelt.train import TrialSettings
from autopelt.train.device import cpu_precision_note
from autopelt.train.packed import run_packed
from autopelt.train.trial import run_trial

MEMBERS = (  # (name, spec, fixed learning rate): each method at a rate it usually learns at
    ("lora r8", {"methods": [{"method": "lora", "rank": 8}]}, 1e-3),
    ("ia3", {"methods": [{"method": "ia3"}]}, 3e-3),
    ("pfeiffer b48", {"methods": [{"method": "pfeiffer", "bottleneck": 48}]}, 1e-3),
    ("bitfit", {"methods": [{"method": "bitfit"}]}, 1e-3),
)
LORA_MEMBERS = tuple((f"lora r8 at {rate:g}", {"methods": [{"method": "lora", "rank": 8}]}, rate)
                     for rate in (5e-4, 1e-3, 2e-3, 4e-3))  # the multi-LoRA packing of the papers


def trial_settings(args, spec: dict, rate: float, out_dir: Path) -> TrialSettings:
    return TrialSettings(task=args.task, spec={**spec, "pooling": args.pooling}, model=args.model,
                         data_dir=args.data_dir, protocol=args.k, dev_size=args.dev_size, seed=0, epochs=args.epochs,
                         max_steps=args.max_steps, batch_size=args.batch_size, learning_rate=rate,
                         threads=args.threads, score_test=False, max_length=args.max_length, out_dir=str(out_dir))


def summarise(mode: str, results: list[dict], wall: float) -> dict:
    """One mode's row: trials, wall seconds, trials per hour, training examples per second over the wall time and
    over the training steps' seconds (a pack's members' shares add up to its steps' time), the dev metrics."""
    examples = sum(r["examples_per_second"] * r["train_seconds"] for r in results)
    train = sum(r["train_seconds"] for r in results)
    return {"mode": mode, "trials": len(results), "ok": sum(r["status"] == "ok" for r in results),
            "wall_seconds": round(wall, 2), "trials_per_hour": round(3600 * len(results) / wall, 1),
            "examples_per_second": round(examples / wall, 1),
            "train_examples_per_second": round(examples / train, 1) if train else 0.0,
            "train_seconds": round(train, 2), "eval_seconds": round(sum(r["eval_seconds"] for r in results), 2),
            "dev": [None if r["dev_metric"] is None else round(r["dev_metric"], 4) for r in results],
            "step_ratio": ((results[0].get("packed") or {}).get("step") or {}).get("ratio"),
            "unpacked": any("unpacked" in (r.get("packed") or {}) for r in results)}


def members_of(args) -> tuple:
    return LORA_MEMBERS if args.members == "lora" else MEMBERS


def warm_up(args) -> None:
    """One step and a small evaluation, untimed: what a process pays once (imports, the attention and bf16
    choices, the tokenisation cache) is paid before either mode runs."""
    _, spec, rate = members_of(args)[0]
    run_trial(trial_settings(args, spec, rate, Path(".")).replace(max_steps=1, dev_size=32, out_dir=None))


def measure(args, mode: str, work: Path) -> dict:
    settings = [trial_settings(args, spec, rate, work / mode / str(i))
                for i, (_, spec, rate) in enumerate(members_of(args))]
    started = time.perf_counter()
    if mode not in ("alone", "packed", "measured"):
        raise SystemExit(f"--order: a mode is alone, packed or measured, not {mode!r}")
    results = [run_trial(s) for s in settings] if mode == "alone" else run_packed(settings,
                                                                                  measure=mode == "measured")
    return summarise(mode, results, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--dev-size", type=int, default=None, help="dev rows (default: the protocol's, 1,000)")
    parser.add_argument("--model", default=None, help="default: autopelt's (all-MiniLM-L6-v2)")
    parser.add_argument("--pooling", default="mean", choices=("mean", "cls"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--members", default="mixed", choices=("mixed", "lora"),
                        help="mixed: LoRA, (IA)3, Pfeiffer, BitFit; lora: four LoRAs at four rates")
    parser.add_argument("--max-steps", type=int, default=None, help="train this many steps instead of --epochs")
    parser.add_argument("--order", default="alone,packed", help="the modes, in the order they run: alone, packed, "
                        "measured (packed where its measured step pays)")
    parser.add_argument("--repeats", type=int, default=1, help="run the modes' order this many times")
    parser.add_argument("--name", default="packed_throughput", help="the results file's name (one a model)")
    parser.add_argument("--out-dir", default=None, help="where the results file goes (default benchmarks/results)")
    args = parser.parse_args(argv)
    from results import write_results  # bench/ is sys.path[0]

    rows = []
    warm_up(args)
    with tempfile.TemporaryDirectory() as work:
        load = os.getloadavg()[0]
        for repeat in range(args.repeats):
            for mode in args.order.split(","):
                row = measure(args, mode, Path(work) / str(repeat))
                rows.append({"repeat": repeat, **row, "load_before": round(load, 2)})
                load = os.getloadavg()[0]
    for row in rows:  # against the one-by-one run of the same repeat
        alone = next((r for r in rows if r["mode"] == "alone" and r["repeat"] == row["repeat"]), None)
        row["speedup"] = round(row["trials_per_hour"] / alone["trials_per_hour"], 3) if alone else None
        row["train_speedup"] = round(row["train_examples_per_second"] / alone["train_examples_per_second"], 3) \
            if alone and alone["train_examples_per_second"] else None
    members = ", ".join(f"{name} at {rate:g}" for name, _, rate in members_of(args))
    path = write_results(args.name, rows, precision=cpu_precision_note(),
                         settings={**vars(args), "members": members}, out_dir=args.out_dir,
                         notes="load_before: the 1-minute load average before the mode ran (shared machine)")
    for row in rows:
        print(row)
    print(f"written to {path}")
    return rows


if __name__ == "__main__":
    main()
