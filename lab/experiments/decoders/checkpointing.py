"""What gradient checkpointing saves and costs: peak memory and step time of a delta's training steps, with and
without `--gradient-checkpointing`, on a language model (default: the packaged SmolLM2-135M).

Each setting runs in its own process (a process's resident memory never shrinks back), loads the model in fp32,
applies the delta, and trains `--steps` steps on random token ids of `--batch` x `--seq` with the target-token loss
of a generation trial; peak memory is sampled as a trial samples it (`device.PeakMemory`: CUDA's counter, or
resident memory on a CPU) over the steps alone, above what the loaded model already held. Writes and prints
`checkpointing-<model>`.

    python lab/experiments/decoders/checkpointing.py [--model smollm2-135m] [--method lora] [--batch 16] [--seq 256] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"


def measure(args) -> dict:
    import torch

    from autopelt import delta
    from autopelt.models import load_language_model, resolve_model
    from autopelt.train import backbone, device as devices
    from autopelt.train.generate import lm_loss

    torch.set_num_threads(args.threads)
    device = devices.pick_device(args.device)
    model = load_language_model(resolve_model(args.model), seed=0)
    spec = delta.PRESETS[args.method]
    backbone.set_gradient_checkpointing(model, args.checkpointing, spec)
    delta.apply_delta(model, spec, seed=0)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.seq), generator=generator)
    batch = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
             "labels": ids.to(device)}
    seconds = []
    with devices.PeakMemory(device) as memory:
        before = memory.mb
        for _ in range(args.warmup + args.steps):
            started = time.perf_counter()
            loss, _ = lm_loss(model, batch)
            loss.backward()
            optimiser.step(), optimiser.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - started)
    return {"checkpointing": args.checkpointing, "step_s": statistics.median(seconds[args.warmup:]),
            "peak_mb_above_model": memory.mb - before if device.type != "cuda" else memory.mb,
            "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", default="lora", help="a preset of autopelt.delta.PRESETS")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default=None)
    parser.add_argument("--results-dir", help="default: benchmarks/results")
    parser.add_argument("--one", choices=("on", "off"), help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args()
    if args.one:
        args.checkpointing = args.one == "on"
        print(json.dumps(measure(args)))
        return
    rows = []
    for setting in ("off", "on"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", setting], check=True,
                             capture_output=True, text=True, cwd=ROOT, env=env).stdout
        rows.append({"model": args.model, "method": args.method, "batch": args.batch, "seq": args.seq,
                     **json.loads(out.strip().splitlines()[-1])})
    plain, checkpointed = rows
    note = (f"checkpointing: {checkpointed['peak_mb_above_model'] / max(plain['peak_mb_above_model'], 1e-9):.2f}x the "
            f"memory above the model, {checkpointed['step_s'] / plain['step_s']:.2f}x the step time; "
            f"same loss: {abs(checkpointed['loss'] - plain['loss']) < 1e-4 * abs(plain['loss'])}")
    sys.path.insert(0, str(ROOT / "bench"))
    from results import write_results

    slug = re.sub(r"[^a-z0-9._-]+", "-", Path(args.model).name.lower()).strip("-.") or "model"
    path = write_results(f"checkpointing-{slug}", rows, precision="fp32", notes=note, out_dir=args.results_dir,
                         settings={"threads": args.threads, "steps": args.steps, "warmup": args.warmup})
    for row in rows:
        print(row)
    print(note, f"({path})")


if __name__ == "__main__":
    main()
