"""Median train-step time of every delta method, against the frozen forward, full fine-tuning and peft's LoRA.

All measured side by side in one process: all-MiniLM-L6-v2, sequence length 128, batch 32, 2 threads.
Usage: python bench/step_times.py [--steps 5] [--warmup 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from autopelt import delta
from autopelt.models import default_model, load_model
from autopelt.train.loop import supervised_loss, training_loss

METHODS = {  # name -> spec: each single method at its paper default, then UniPELT(APL)
    "lora r8 (q,v)": delta.PRESETS["lora"],
    "adapter (pfeiffer 48)": delta.PRESETS["adapter"],
    "adapter (houlsby 48)": delta.PRESETS["houlsby"],
    "prefix L10": delta.PRESETS["prefix"],
    "prompt L20": delta.PRESETS["prompt"],
    "bitfit": delta.PRESETS["bitfit"],
    "phm-adapter n4": {"methods": [{"method": "phm_adapter", "n": 4, "bottleneck": 48}]},
    "compacter n4": delta.PRESETS["compacter"],
    "compacter++ n4": delta.PRESETS["compacter++"],
    "adamix M4 (ffn adapter 48)": delta.PRESETS["adamix"],
    "adamix M4, no consistency": {"methods": [{**delta.PRESETS["adamix"]["methods"][0], "consistency": 0.0}]},
    "UniPELT(APL)": delta.PRESETS["unipelt_apl"],
    "ia3 (k,v,ffn)": delta.PRESETS["ia3"],
    "dora r8 (q,v)": delta.PRESETS["dora"],
    "rslora r8 (q,v)": delta.PRESETS["rslora"],
    "vera r1024 (q,v)": delta.PRESETS["vera"],
}
SINGLE_METHOD_TARGET, LORA_TARGET, UNIPELT_TARGET = 0.8, 1.0, 1.0


def batch(seq: int, size: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(1000, 30000, (size, seq), generator=g),
            "attention_mask": torch.ones(size, seq, dtype=torch.long),
            "labels": torch.randint(0, 2, (size,), generator=g)}


def interleaved(steps: dict, repeats: int, warmup: int) -> dict[str, float]:
    """Median seconds per step of each configuration, run round-robin so that load from anything else on
    the machine falls on every configuration alike."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for repeat in range(warmup + repeats):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            if repeat >= warmup:
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def optimiser_step(model, loss_fn):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)

    def step():
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def build_steps(name: str, data: dict) -> tuple[dict, dict]:
    """name -> one step callable, and name -> trainable parameters."""
    inputs = {k: v for k, v in data.items() if k != "labels"}
    fresh = lambda: load_model(name, 2, seed=0).train()  # noqa: E731
    frozen = fresh().eval()

    def forward():
        with torch.no_grad():
            frozen(**inputs)

    full = fresh()
    steps = {"frozen forward": forward,
             "full fine-tuning": optimiser_step(full, lambda: supervised_loss(full(**inputs).logits, data["labels"]))}
    params = {"full fine-tuning": sum(p.numel() for p in full.parameters())}
    peft_step = _peft_lora(fresh(), data)
    if peft_step is not None:
        steps["peft LoRA r8 (q,v)"], params["peft LoRA r8 (q,v)"] = peft_step
    for label, spec in METHODS.items():
        model = delta.apply_delta(fresh(), spec, seed=0)
        routing = torch.Generator().manual_seed(1)
        adamix = next((m for m in delta.parse_spec(spec).methods if m.method == "adamix"), None)
        consistency = adamix.consistency if adamix else 0.0
        mixed = delta.has_mixtures(model)
        steps[label] = optimiser_step(
            model, lambda model=model, routing=routing, c=consistency, m=mixed: training_loss(model, dict(data), routing, c, m))
        params[label] = delta.count_parameters(spec, model.config).trainable
    return steps, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps, params = build_steps(default_model(), batch(args.seq, args.batch))
    medians = interleaved(steps, args.steps, args.warmup)
    _print_table(medians, params, args)


def _peft_lora(model, data):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return None
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                             modules_to_save=["classifier"]))
    inputs = {k: v for k, v in data.items() if k != "labels"}
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return optimiser_step(model, lambda: supervised_loss(model(**inputs).logits, data["labels"])), trainable


def _print_table(medians: dict, params: dict, args) -> None:
    forward, full = medians["frozen forward"], medians["full fine-tuning"]
    peft_lora = medians.get("peft LoRA r8 (q,v)")
    print(f"all-MiniLM-L6-v2 · seq {args.seq} · batch {args.batch} · {args.threads} threads · "
          f"median of {args.steps} interleaved steps after {args.warmup} warm-up round")
    print()
    print("| configuration | trainable params | step (s) | × forward | × full FT | × peft LoRA | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for label, seconds in medians.items():
        target = ""
        if label in METHODS and label.startswith("lora"):
            ok = peft_lora is None or seconds / peft_lora <= LORA_TARGET
            target = f"≤ {LORA_TARGET}× peft LoRA: {'met' if ok else 'MISSED'}"
        elif label.startswith("UniPELT"):
            target = f"≤ {UNIPELT_TARGET}× full FT: {'met' if seconds / full <= UNIPELT_TARGET else 'MISSED'}"
        elif label in METHODS:
            target = f"≤ {SINGLE_METHOD_TARGET}× full FT: {'met' if seconds / full <= SINGLE_METHOD_TARGET else 'MISSED'}"
        vs_peft = f"{seconds / peft_lora:.2f}" if peft_lora else "–"
        count = f"{params[label]:,}" if label in params else "–"
        print(f"| {label} | {count} | {seconds:.3f} | {seconds / forward:.2f} | {seconds / full:.2f} | "
              f"{vs_peft} | {target} |")


if __name__ == "__main__":
    main()
