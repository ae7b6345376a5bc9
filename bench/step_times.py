"""Median train-step time of every delta method, against the frozen forward, full fine-tuning and peft's LoRA.

All measured side by side in one process, in each precision as the trainer runs it (autocast, the frozen weights
cast once): all-MiniLM-L6-v2, sequence length 128, batch 32, 2 threads.
Usage: python bench/step_times.py [--steps 5] [--warmup 1] [--threads 2] [--precisions fp32,bf16] [--only lora,UniPELT]
       [--model smollm2-135m]   (a method the model's family cannot take, BitFit on Llama, is skipped with its reason)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from autopelt import delta
from autopelt.errors import UserError
from autopelt.models import load_model, resolve_model
from autopelt.train import device as devices
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
PRECISION_TARGET = 0.55  # a bf16 step against the same configuration's fp32 step, where bf16 is native
FORWARD, FULL, PEFT_LORA = "frozen forward", "full fine-tuning", "peft LoRA r8 (q,v)"
CPU = torch.device("cpu")


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


def optimiser_step(model, loss_fn, dtype=None):
    """One training step as the trainer takes it: under autocast in `dtype` (None: fp32), the frozen weights
    cast to it once beforehand, trainable parameters and optimiser state in fp32."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    devices.cast_frozen_weights(model, dtype)

    def step():
        with devices.autocast(CPU, dtype):
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def build_steps(name: str, data: dict, dtype) -> tuple[dict, dict]:
    """configuration -> one step callable in precision `dtype`, and configuration -> trainable parameters."""
    inputs = {k: v for k, v in data.items() if k != "labels"}
    fresh = lambda: load_model(name, 2, seed=0).train()  # noqa: E731
    frozen = fresh().eval()
    devices.cast_frozen_weights(frozen, dtype)

    def forward():
        with torch.inference_mode(), devices.autocast(CPU, dtype):
            frozen(**inputs)

    full = fresh()
    steps = {FORWARD: forward,
             FULL: optimiser_step(full, lambda: supervised_loss(full(**inputs).logits, data["labels"]), dtype)}
    params = {FULL: sum(p.numel() for p in full.parameters())}
    peft_step = _peft_lora(fresh(), data, dtype)
    if peft_step is not None:
        steps[PEFT_LORA], params[PEFT_LORA] = peft_step
    for label, spec in METHODS.items():
        try:
            model = delta.apply_delta(fresh(), spec, seed=0)
        except UserError as error:
            print(f"{label}: skipped ({error})")
            continue
        routing = torch.Generator().manual_seed(1)
        adamix = next((m for m in delta.parse_spec(spec).methods if m.method == "adamix"), None)
        consistency = adamix.consistency if adamix else 0.0
        mixed = delta.has_mixtures(model)
        steps[label] = optimiser_step(
            model, lambda model=model, routing=routing, c=consistency, m=mixed: training_loss(model, dict(data), routing, c, m),
            dtype)
        params[label] = delta.count_parameters(spec, model.config).trainable
    return steps, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated, among fp32, bf16, fp16")
    parser.add_argument("--only", help="comma-separated starts of configuration names to time, e.g. lora,UniPELT "
                                       "(the forward, full fine-tuning and peft LoRA always run)")
    parser.add_argument("--model", help="base model folder, hub id or packaged name (default: all-MiniLM-L6-v2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    steps, params = {}, {}
    for precision in precisions:
        built, params = build_steps(resolve_model(args.model), batch(args.seq, args.batch),
                                    devices.autocast_dtype(precision))
        steps.update({(label, precision): step for label, step in built.items()
                      if _chosen(label, args.only)})
    medians = interleaved(steps, args.steps, args.warmup)
    _print_table(medians, params, precisions, args)


def _chosen(label: str, only: str | None) -> bool:
    return not only or label in (FORWARD, FULL, PEFT_LORA) or label.startswith(tuple(only.split(",")))


def _peft_lora(model, data, dtype):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return None
    from autopelt.delta.sites import architecture_of

    arch = architecture_of(model.config)  # q,v of this family (BERT's query/value, Llama's q_proj/v_proj)
    targets = sorted({arch.linears[arch.aliases.get(s, s)].rsplit(".", 1)[-1] for s in ("query", "value")})
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets,
                                             modules_to_save=[arch.head]))
    inputs = {k: v for k, v in data.items() if k != "labels"}
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return optimiser_step(model, lambda: supervised_loss(model(**inputs).logits, data["labels"]), dtype), trainable


def _target(label: str, seconds: float, full: float, peft_lora: float | None) -> str:
    if label in METHODS and label.startswith("lora"):
        ok = peft_lora is None or seconds / peft_lora <= LORA_TARGET
        return f"≤ {LORA_TARGET}× peft LoRA: {'met' if ok else 'MISSED'}"
    if label.startswith("UniPELT"):
        return f"≤ {UNIPELT_TARGET}× full FT: {'met' if seconds / full <= UNIPELT_TARGET else 'MISSED'}"
    if label in METHODS:
        return f"≤ {SINGLE_METHOD_TARGET}× full FT: {'met' if seconds / full <= SINGLE_METHOD_TARGET else 'MISSED'}"
    return ""


def _print_table(medians: dict, params: dict, precisions: list[str], args) -> None:
    """One row per configuration and precision; ratios against the fp32 frozen forward and, per precision,
    against full fine-tuning and peft's LoRA in that precision; bf16/fp16 rows also against their own fp32 step."""
    fp32_forward = medians.get((FORWARD, "fp32"))
    print(f"all-MiniLM-L6-v2 · seq {args.seq} · batch {args.batch} · {args.threads} threads · "
          f"median of {args.steps} interleaved steps after {args.warmup} warm-up round · "
          f"{devices.cpu_precision_note()}")
    print()
    print("| configuration | precision | trainable params | step (s) | × fp32 step | × fp32 forward | × full FT "
          "| × peft LoRA | target |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for (label, precision), seconds in medians.items():
        full, peft_lora = medians[(FULL, precision)], medians.get((PEFT_LORA, precision))
        own_fp32 = medians.get((label, "fp32"))
        target = _target(label, seconds, full, peft_lora)
        if precision != "fp32" and own_fp32:
            ok = seconds / own_fp32 <= PRECISION_TARGET
            target = "; ".join(t for t in (target, f"≤ {PRECISION_TARGET}× fp32: {'met' if ok else 'MISSED'}") if t)
        print(f"| {label} | {precision} | {f'{params[label]:,}' if label in params else '–'} | {seconds:.3f} | "
              f"{_ratio(seconds, own_fp32)} | {_ratio(seconds, fp32_forward)} | {seconds / full:.2f} | "
              f"{_ratio(seconds, peft_lora)} | {target} |")


def _ratio(seconds: float, reference: float | None) -> str:
    return f"{seconds / reference:.2f}" if reference else "–"


if __name__ == "__main__":
    main()
