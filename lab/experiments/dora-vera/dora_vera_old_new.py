"""Whole train steps of DoRA and VeRA with an older commit's forward (old) and this tree's (new), against autopelt's
and peft's LoRA, interleaved in one process: all-MiniLM-L6-v2, the model's dropout, sdpa, fp32 and bf16.

The old forward comes from a copy of an older tree's package:
  git archive d3e977e autopelt | tar -x -C /tmp/old
  python lab/experiments/dora-vera/dora_vera_old_new.py --old-tree /tmp/old [--steps 8] [--batch 8] [--threads 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import step_times as st  # noqa: E402

from autopelt import delta  # noqa: E402
from autopelt.delta.modules.lora import DoRALinear  # noqa: E402
from autopelt.delta.modules.vera import VeRALinear  # noqa: E402
from autopelt.models import default_model, load_model  # noqa: E402
from autopelt.train import device as devices  # noqa: E402
from autopelt.train.classify import training_loss  # noqa: E402

CONFIGS = (("lora", "lora", False), ("dora new", "dora", False), ("dora old", "dora", True),
           ("vera new", "vera", False), ("vera old", "vera", True))


def old_forwards(tree: Path) -> dict:
    def load(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    modules = tree / "autopelt" / "delta" / "modules"
    return {DoRALinear: load("old_lora", modules / "lora.py").DoRALinear.forward,
            VeRALinear: load("old_vera", modules / "vera.py").VeRALinear.forward}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-tree", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old = old_forwards(args.old_tree)
    data = st.batch(128, args.batch)
    steps = {}
    for precision in ("fp32", "bf16"):
        dtype = devices.autocast_dtype(precision)
        fresh = lambda: load_model(default_model(), 2, seed=0).train()  # noqa: E731
        steps[("peft LoRA", precision)] = st._peft_lora(fresh(), data, dtype)[0]
        for label, preset, patched in CONFIGS:
            model = delta.apply_delta(fresh(), delta.PRESETS[preset], seed=0)
            for module in model.modules() if patched else ():
                if type(module) in old:
                    module.forward = types.MethodType(old[type(module)], module)
            steps[(label, precision)] = st.optimiser_step(
                model, lambda model=model: training_loss(model, dict(data), None, 0.0, False), dtype)
    times = st.interleaved(steps, args.steps, 1)
    for precision in ("fp32", "bf16"):
        reference = statistics.median(times[("peft LoRA", precision)])
        for (label, p), values in times.items():
            if p == precision:
                seconds = statistics.median(values)
                print(f"{precision} {label:10s} {seconds:.3f} s  {seconds / reference:.2f}x peft LoRA")
    if args.out:
        args.out.write_text(json.dumps({f"{k[0]} {k[1]}": v for k, v in times.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
