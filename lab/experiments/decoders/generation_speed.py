"""How long scoring a generation task's test split takes: greedy generation for every distinct E2E test input
(630 meaning representations) with a trained delta and with none, on this machine.

The delta is trained here first, as a generation trial trains it (LoRA r8 on q,v of the packaged SmolLM2-135M,
`--k` rows, `--epochs`, `--lr`; test not scored by the trial), then loaded into a fresh model for each timed pass.
A pass times `autopelt.train.generate.generate` over all inputs at the trial's batch size (`--batch-size`,
TrialSettings.eval_batch_size by default) and scores its texts with corpus BLEU and ROUGE-L against every
reference. Writes and prints `generation-speed-<model>` after each pass.

    python lab/experiments/decoders/generation_speed.py --e2e-dir ../shared/data/gen [--model smollm2-135m] [--k 200]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"
PASSES = {"lora": "LoRA r8 (q,v)", "zero-shot": "zero-shot (the fixed prompt, no delta)"}


def main() -> None:
    import torch

    from autopelt import delta
    from autopelt.data.generation import (
        GenerationTask, corpus_scores, load_generation_splits, make_generation_splits, references_by_input,
    )
    from autopelt.dtypes import cast_frozen_weights
    from autopelt.models import load_language_model, load_tokenizer, resolve_model
    from autopelt.train import TrialSettings, device as devices, run_trial
    from autopelt.train.generate import MAX_NEW_TOKENS, generate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--e2e-dir", required=True, help="the folder holding e2e/ (train, validation, test)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--k", type=int, default=200, help="training rows of the delta")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3, help="default: the rate dev picked for LoRA on E2E")
    parser.add_argument("--batch-size", type=int, default=TrialSettings.eval_batch_size)
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--limit", type=int, help="time only the first N test inputs (a quick look, not the figure)")
    parser.add_argument("--passes", default="lora,zero-shot", help="timed passes, in order: lora, zero-shot")
    parser.add_argument("--results-dir", help="default: benchmarks/results")
    args = parser.parse_args()

    unknown = set(args.passes.split(",")) - set(PASSES)
    if unknown:
        raise SystemExit(f"--passes: {', '.join(sorted(unknown))} unknown; choose from {', '.join(PASSES)}")
    torch.set_num_threads(args.threads)
    model_name = resolve_model(args.model)
    task = GenerationTask("e2e", "mr", "ref")
    with tempfile.TemporaryDirectory() as out:
        settings = TrialSettings(task="e2e", spec=delta.PRESETS["lora"], model=args.model, data_dir=args.e2e_dir, protocol=args.k,
                                 seed=0, epochs=args.epochs, learning_rate=args.lr, batch_size=16, max_length=96,
                                 threads=args.threads, precision=args.precision, score_test=False, out_dir=out,
                                 custom_task={"input_column": "mr", "target_column": "ref"})
        trained = run_trial(settings)
        if trained["status"] != "ok":
            raise SystemExit(f"the delta did not train: {trained['reason']}")
        splits = make_generation_splits(load_generation_splits(task, args.e2e_dir), task, args.k,
                                        settings.split_seed, settings.dev_size)
        inputs, references = references_by_input(splits.test, task)
        inputs, references = inputs[:args.limit], references[:args.limit]
        prompts = [task.prompt(row) for row in inputs]
        tokenizer = load_tokenizer(model_name)
        device = devices.pick_device(None)
        precision = devices.resolve_precision(args.precision, device)
        dtype = devices.autocast_dtype(precision)
        rows = []
        for arm in args.passes.split(","):
            model = load_language_model(model_name, seed=0)
            if arm == "lora":
                delta.load_delta(model, trained["delta_dir"], seed=0)
            cast_frozen_weights(model, dtype)
            started = time.perf_counter()
            texts = generate(model, tokenizer, prompts, args.batch_size, args.max_new_tokens, device, dtype)
            seconds = time.perf_counter() - started
            scores = corpus_scores(texts, references)
            rows.append({"delta": PASSES[arm], "inputs": len(prompts), "batch_size": args.batch_size,
                         "seconds": round(seconds, 1), "bleu": round(scores["bleu"], 2),
                         "rouge_l": round(scores["rouge_l"], 2)})
            print(rows[-1], flush=True)
            path = write(args, rows, precision, trained)  # after every pass: a run cut short keeps what it measured
    print(f"({path})")


def write(args, rows: list[dict], precision: str, trained: dict) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    from results import write_results

    slug = re.sub(r"[^a-z0-9._-]+", "-", Path(args.model).name.lower()).strip("-.") or "model"
    note = (f"the delta: LoRA r8 (q,v) trained on K={args.k} rows for {args.epochs} epoch(s) at {args.lr:g} "
            f"(dev loss {-trained['dev_metric']:.3f}); "
            f"max {args.max_new_tokens} new tokens, greedy, left-padded batches with the KV cache")
    return write_results(f"generation-speed-{slug}", rows, precision=precision, notes=note, out_dir=args.results_dir,
                         settings={"threads": args.threads, "k": args.k, "epochs": args.epochs, "lr": args.lr,
                                   "limit": args.limit, "passes": args.passes})


if __name__ == "__main__":
    main()
