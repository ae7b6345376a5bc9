"""Writes the format-2 deltas in tests/data/delta_v2_* with the autopelt of commit b759325,
before IA3, VeRA, DoRA, rsLoRA and the shifted prefix.

Run from a checkout of that commit, beside this repository's tests:
    PYTHONPATH=<old checkout> python tests/data/make_v2_deltas.py
Each folder holds what that autopelt saved (delta.json, delta.safetensors) and the logits it gave on
`tiny_batch()` (logits.json); tests/test_delta_legacy.py loads them with today's code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import tiny_batch, tiny_model  # noqa: E402

from autopelt import delta  # noqa: E402

SPECS = {  # every method of format 2 whose entries gained fields since (lora: rslora, dora; prefix: shift_positions)
    "delta_v2_unipelt_bitfit": {"methods": [
        {"method": "pfeiffer", "bottleneck": 8, "gate": True},
        {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
        {"method": "lora", "rank": 4, "gate": True},
        {"method": "bitfit"}]},
    "delta_v2_lora_houlsby_prompt": {"methods": [
        {"method": "lora", "rank": 2, "targets": ["value", "output"]},
        {"method": "houlsby", "bottleneck": 4},
        {"method": "prompt", "length": 2}]},
}


def main() -> None:
    for name, spec in SPECS.items():
        model = delta.apply_delta(tiny_model("bert"), spec, seed=0)
        generator = torch.Generator().manual_seed(5)
        with torch.no_grad():  # stand-in for training: every trainable tensor moves
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.3 * torch.randn(p.shape, generator=generator))
        model.eval()
        out = HERE / name
        delta.save_delta(model, spec, out)
        with torch.no_grad():
            logits = model(**tiny_batch()).logits
        (out / "logits.json").write_text(json.dumps(logits.tolist()) + "\n")
        print(out, json.loads((out / "delta.json").read_text())["format"])


if __name__ == "__main__":
    main()
