"""Would caching the frozen lower layers pay? Measures what such a cache could save, before anyone builds it.

A delta whose lowest modified layer is k leaves the embeddings and layers below k frozen: their outputs for a
row never change, so a cache could skip them. Exactly (dropout plays no part) in evaluation; in training only
if dropout were switched off below k, which changes the training itself. This script measures
1. the share of a forward pass spent below layer k, for every k (all-MiniLM-L6-v2, eval batches of 128);
2. how often the default space draws a delta with k > 0 (random draws);
3. what a cache would save of a whole trial (SST-2, K=1000, 3 epochs: the dev set evaluated after every epoch),
   from the measured times of a real LoRA trial.

    python lab/experiments/frozen-layers/frozen_layers.py --data-dir ../shared/data/glue-full [--draws 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import optuna
import torch

from autopelt import delta
from autopelt.models import default_model, load_model
from autopelt.search.space import load_space
from autopelt.train import TrialSettings, run_trial


def lowest_modified_layer(spec: dict, num_layers: int) -> int:
    """The first layer a delta changes; 0 when it touches the embeddings (prompt, BitFit's embedding biases)."""
    lowest = num_layers
    for entry in delta.parse_spec(spec).methods:
        inner = getattr(entry, "delta", entry)
        if entry.method == "prompt":
            return 0
        if entry.method == "bitfit" and (entry.targets is None or "embeddings" in entry.targets):
            return 0
        layers = getattr(inner, "layers", None)
        lowest = min(lowest, min(layers) if layers else 0)
    return lowest


def forward_share_below(model, ids, mask, repeats: int) -> list[float]:
    """share[k]: the fraction of a forward pass spent in the embeddings and layers 0..k-1 (k = 0..L)."""
    backbone = model.bert
    layers = backbone.encoder.layer
    times = {}
    with torch.inference_mode():
        for k in range(len(layers) + 1):
            backbone.encoder.layer = layers[:k]
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                backbone(input_ids=ids, attention_mask=mask)
                samples.append(time.perf_counter() - started)
            times[k] = statistics.median(samples)
    backbone.encoder.layer = layers
    return [times[k] / times[len(layers)] for k in range(len(layers) + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = load_model(default_model(), 2).eval()
    num_layers = model.config.num_hidden_layers
    ids = torch.randint(1000, 30000, (128, 48), generator=torch.Generator().manual_seed(0))
    share = forward_share_below(model, ids, torch.ones_like(ids), args.repeats)
    print("share of a forward pass below layer k:", " ".join(f"k={k}: {s:.2f}" for k, s in enumerate(share)))

    space, sampler = load_space("default"), optuna.samplers.RandomSampler(seed=0)
    study = optuna.create_study(sampler=sampler)
    ks = [lowest_modified_layer(space.sample(study.ask(), num_layers)[0], num_layers) for _ in range(args.draws)]
    counts = {k: ks.count(k) / len(ks) for k in range(num_layers)}
    print(f"default space, {args.draws} random draws, lowest modified layer:",
          " ".join(f"k={k}: {100 * c:.0f}%" for k, c in counts.items()))

    result = run_trial(TrialSettings(task="sst2", spec=delta.PRESETS["lora"], data_dir=args.data_dir, protocol=1000,
                                     learning_rate=3e-3, threads=args.threads, precision="fp32"))
    total, train, evals = result["total_seconds"], result["train_seconds"], result["eval_seconds"]
    dev_passes = len(result["history"])
    dev_eval = evals * result["protocol"]["dev_size"] * dev_passes / (
        result["protocol"]["dev_size"] * dev_passes + result["protocol"]["test_size"])
    # the first dev pass fills the cache; later ones (and the test set, never seen before) run from it or in full
    saved_eval = [dev_eval * (dev_passes - 1) / dev_passes * share[k] for k in range(num_layers)]
    forward_of_step = 1 / 3  # a training step is about one forward and a backward of twice its cost
    saved_train = [train * forward_of_step * (dev_passes - 1) / dev_passes * share[k] for k in range(num_layers)]
    print(f"LoRA trial: {total:.1f} s = train {train:.1f} + eval {evals:.1f} (dev ~{dev_eval:.1f}) + other")
    print("| lowest modified layer k | share of draws | saved, evaluation only (exact) | "
          "saved, also training without dropout below k |")
    print("|---:|---:|---:|---:|")
    for k in range(num_layers):
        print(f"| {k} | {100 * counts[k]:.0f}% | {100 * saved_eval[k] / total:.1f}% | "
              f"{100 * (saved_eval[k] + saved_train[k]) / total:.1f}% |")
    expected = sum(counts[k] * saved_eval[k] for k in range(num_layers)) / total
    expected_train = sum(counts[k] * (saved_eval[k] + saved_train[k]) for k in range(num_layers)) / total
    print(f"expected over default-space draws: {100 * expected:.1f}% of a trial (exact), "
          f"{100 * expected_train:.1f}% with training changed")


if __name__ == "__main__":
    main()
