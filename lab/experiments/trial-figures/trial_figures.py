"""Trial-runner figures on real RTE with all-MiniLM-L6-v2:

  (a) training examples/s with dynamic padding vs padding every batch to the maximum length,
  (b) the share of a one-epoch trial spent outside train and eval steps (data, cache, build, save),
  (c) dev/test accuracy of each single method at paper defaults and of UniPELT(APL), K=1000 protocol,
      over several seeds (mean ± std).

Usage: python lab/experiments/trial-figures/trial_figures.py --data-dir ../shared/data/glue [--part a,b,c] [--seeds 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from autopelt import delta
from autopelt.data import pad_batch, train_order
from autopelt.delta.presets import PAPER_LEARNING_RATES
from autopelt.models import default_model, load_model, load_tokenizer
from autopelt.train import TrialSettings, run_trial
from autopelt.train.trial_data import prepare_data
from autopelt.train.classify import supervised_loss

METHODS = ("lora", "adapter", "prefix", "compacter", "bitfit", "prompt", "unipelt_apl")


def padding_throughput(data_dir: str, steps: int, threads: int) -> None:
    settings = TrialSettings(task="rte", spec=delta.PRESETS["lora"], data_dir=data_dir, protocol=1000, threads=threads)
    data = prepare_data(settings, load_tokenizer(default_model()))
    model = delta.apply_delta(load_model(default_model(), 2), settings.spec).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batches = train_order(data.train, settings.batch_size, seed=0)[:steps]

    def run(pad_to_max: bool) -> float:
        examples, started = 0, time.perf_counter()
        for indices in batches:
            batch = pad_batch(data.train, indices)
            if pad_to_max:
                batch = _pad_to(batch, settings.max_length, data.train.pad_id)
            labels = batch.pop("labels")
            supervised_loss(model(**batch).logits, labels).backward()
            optimizer.step()
            optimizer.zero_grad()
            examples += len(labels)
        return examples / (time.perf_counter() - started)

    dynamic, padded = run(False), run(True)
    mean_tokens = float(data.train.lengths.mean())
    print(f"(a) RTE K=1000, LoRA r8, batch 32, {steps} steps, {threads} threads, mean {mean_tokens:.0f} tokens/row:")
    print(f"    dynamic padding {dynamic:.1f} examples/s · padded to {settings.max_length}: {padded:.1f} "
          f"examples/s · speed-up {dynamic / padded:.2f}×")


def _pad_to(batch: dict, length: int, pad_id: int) -> dict:
    out = {}
    for key, value in batch.items():
        if value.dim() == 2:
            fill = pad_id if key == "input_ids" else 0
            extra = torch.full((value.shape[0], length - value.shape[1]), fill, dtype=value.dtype)
            value = torch.cat([value, extra], dim=1)
        out[key] = value
    return out


def overhead_share(data_dir: str, threads: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        settings = TrialSettings(task="rte", spec=delta.PRESETS["lora"], data_dir=data_dir, protocol=1000, epochs=1,
                                 threads=threads, out_dir=out)
        run_trial(settings.replace(out_dir=None, max_steps=1))  # warm the tokenisation cache, as a search does
        result = run_trial(settings)
    total = result["total_seconds"]
    print(f"(b) one-epoch RTE K=1000 LoRA trial: total {total:.1f}s = train {result['train_seconds']:.1f}s + "
          f"eval {result['eval_seconds']:.1f}s + other {result['overhead_seconds']:.1f}s "
          f"({100 * result['overhead_seconds'] / total:.1f}% outside train and eval steps; target ≤ 5%)")


def method_accuracy(data_dir: str, seeds: int, epochs: int, threads: int, methods) -> None:
    print(f"(c) RTE, K=1000 protocol (1,000 train, 1,000 dev, official validation = test), {epochs} epochs, "
          f"{seeds} seeds, all-MiniLM-L6-v2")
    print("| method | stored params % | dev accuracy | test accuracy | seconds per run |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for name in methods:
        dev, test, seconds, pct = [], [], [], 0.0
        for seed in range(seeds):
            settings = TrialSettings(task="rte", spec=delta.PRESETS[name], data_dir=data_dir, protocol=1000,
                                     seed=seed, epochs=epochs, threads=threads,
                                     learning_rate=PAPER_LEARNING_RATES[name])
            result = run_trial(settings)
            if result["status"] != "ok":
                print(f"| {name} | failed: {result['reason']} | | | |")
                break
            dev.append(100 * result["dev_metric"])
            test.append(100 * result["test"]["accuracy"])
            seconds.append(result["total_seconds"])
            pct = result["params"]["stored_pct"]
        else:
            print(f"| {name} | {pct:.3f} | {_mean_std(dev)} | {_mean_std(test)} | {statistics.fmean(seconds):.0f} |")
            rows.append({"method": name, "stored params %": pct, "dev accuracy": _mean_std(dev),
                         "test accuracy": _mean_std(test), "seconds per run": statistics.fmean(seconds)})
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # bench/results.py
    from results import write_results

    write_results("trial-figures", rows, precision=result.get("precision"),
                  settings={"task": "rte", "k": 1000, "epochs": epochs, "seeds": seeds, "threads": threads})


def _mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {std:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--part", default="a,b,c")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="(a): training steps per padding mode")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = set(args.part.split(","))
    if "a" in parts:
        padding_throughput(args.data_dir, args.steps, args.threads)
    if "b" in parts:
        overhead_share(args.data_dir, args.threads)
    if "c" in parts:
        method_accuracy(args.data_dir, args.seeds, args.epochs, args.threads, args.methods.split(","))


if __name__ == "__main__":
    main()
