"""Median train-step time of every delta method, per precision, backbone dropout and attention implementation.

All measured side by side in one process, in each precision as the trainer runs it (autocast, the frozen weights
cast once): all-MiniLM-L6-v2, sequence length 128, batch 32, 2 threads. Every delta method, peft's LoRA and full
fine-tuning are timed under each backbone dropout (model, attention-off, off) and attention implementation (sdpa,
eager); the frozen forward (the 2x-forward floor of a PEFT step) under each attention implementation. One model per
method and precision is switched between the settings, and every configuration is timed round-robin, so that load
from anything else on the machine falls on every configuration alike. `--compile` adds each training configuration
again on its own model under `torch.compile` (its forward and backward; the optimiser step eager), in the first
backbone dropout and attention given only (switching them would recompile it); every row records its first step,
compilation included, as `first_seconds`.

The results go to --out (default benchmarks/results/step_times-<date>.json) with the command, commit, date, CPU
model and flags, torch version and threads. `render` puts a results file's tables (each step's ratios to fp32, to
peft's LoRA and to the 2x-forward floor) into a page between its step-times markers (default docs/evidence/speed.md).
Usage: python bench/step_times.py render [RESULTS.json] [--doc PAGE] [--markers step-times]
       python bench/step_times.py [--steps 2] [--warmup 1] [--threads 2] [--precisions fp32,bf16]
                                  [--dropouts model,attention-off,off] [--attentions sdpa,eager] [--only lora,dora]
                                  [--model smollm2-135m]   (a method the family cannot take is skipped)
                                  [--compile]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from autopelt import delta
from autopelt.dtypes import cast_frozen_weights
from autopelt.errors import UserError
from autopelt.models import load_model, resolve_model
from autopelt.train import backbone, device as devices
from autopelt.train.classify import supervised_loss, training_loss

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
FORWARD, FULL, PEFT_LORA = "frozen forward", "full fine-tuning", "peft LoRA r8 (q,v)"
COMPILED = " · compiled"  # a configuration's name under torch.compile
CPU = torch.device("cpu")
STATISTICS = {"median": statistics.median, "min": min}
RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def markers(name: str = "step-times") -> tuple[str, str]:
    """The page markers the tables of a results file go between."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


START, END = markers()


def batch(seq: int, size: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(1000, 30000, (size, seq), generator=g),
            "attention_mask": torch.ones(size, seq, dtype=torch.long),
            "labels": torch.randint(0, 2, (size,), generator=g)}


def interleaved(steps: dict, repeats: int, warmup: int) -> tuple[dict[tuple, list[float]], dict[tuple, float]]:
    """Seconds of every measured step of each configuration, run round-robin so that load from anything else on
    the machine falls on every configuration alike; and of each one's first step (a compiled one's compilation)."""
    times: dict[tuple, list[float]] = {key: [] for key in steps}
    first: dict[tuple, float] = {}
    for repeat in range(warmup + repeats):
        for key, step in steps.items():
            started = time.perf_counter()
            step()
            first.setdefault(key, time.perf_counter() - started)
            if repeat >= warmup:
                times[key].append(time.perf_counter() - started)
        print(f"round {repeat + 1}/{warmup + repeats} done", file=sys.stderr, flush=True)
    return times, first


class Switch:
    """Puts one model's backbone into a dropout mode and attention implementation, and back: the rates of the
    pretrained model's own dropouts under each mode are read before a delta is injected, so a delta's dropout is
    never touched."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
        original = [m.p for m in self.dropouts]
        self.rates = {}
        for mode in backbone.BACKBONE_DROPOUTS:
            backbone.set_backbone_dropout(model, mode)
            self.rates[mode] = [m.p for m in self.dropouts]
            for module, rate in zip(self.dropouts, original):
                module.p = rate

    def __call__(self, mode: str, attention: str) -> None:
        for module, rate in zip(self.dropouts, self.rates[mode]):
            module.p = rate
        backbone.set_attention(self.model, attention)


def optimiser_step(model, loss_fn, dtype=None):
    """One training step as the trainer takes it: under autocast in `dtype` (None: fp32), the frozen weights
    cast to it once beforehand, trainable parameters and optimiser state in fp32."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    cast_frozen_weights(model, dtype)

    def step():
        with devices.autocast(CPU, dtype):
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def switched(step, switch: Switch, mode: str, attention: str):
    def run():
        switch(mode, attention)
        step()

    return run


def build_steps(name: str, data: dict, dtype, dropouts: list[str], attentions: list[str], only: str | None,
                method_settings: list[tuple[str, str]] | None = None, compile: bool = False) -> tuple[dict, dict]:
    """(configuration, dropout, attention) -> one step callable in precision `dtype`; configuration -> trainable
    parameters. The frozen forward runs in inference mode (no dropout): one row per attention implementation.
    LoRA and peft's LoRA run under every dropout and attention; the others too, or only under `method_settings`.
    With `compile`, every training configuration again as "<configuration> · compiled", on its own model under
    `torch.compile`, in the first dropout and attention only."""
    inputs = {k: v for k, v in data.items() if k != "labels"}
    fresh = lambda: load_model(name, 2, seed=0).train()  # noqa: E731
    frozen = fresh().eval()
    cast_frozen_weights(frozen, dtype)
    frozen_switch = Switch(frozen)

    def forward():
        with torch.inference_mode(), devices.autocast(CPU, dtype):
            frozen(**inputs)

    steps = {(FORWARD, "–", attention): switched(forward, frozen_switch, "model", attention)
             for attention in attentions}
    labels = [FULL, PEFT_LORA, *(label for label in METHODS if _chosen(label, only))]
    built, params = {}, {}
    for label in labels:
        made = _trainable(label, fresh, data)
        if made is None:
            continue
        model, switch, loss, params[label] = made
        built[label] = (optimiser_step(model, loss, dtype), switch)
    for label, (step, switch) in built.items():
        every = label in (PEFT_LORA, "lora r8 (q,v)") or method_settings is None
        for mode, attention in ([(m, a) for m in dropouts for a in attentions] if every else method_settings):
            steps[(label, mode, attention)] = switched(step, switch, mode, attention)
    if compile:
        for label in built:
            model, switch, loss, params[label + COMPILED] = _trainable(label, fresh, data, compiled=True)
            steps[(label + COMPILED, dropouts[0], attentions[0])] = switched(
                optimiser_step(model, loss, dtype), switch, dropouts[0], attentions[0])
    return steps, params


def _trainable(label: str, fresh, data: dict, compiled: bool = False):
    """(model, its backbone's Switch (read before the delta goes in), its loss as the trainer computes it,
    trainable parameters) for a configuration, or None where the family cannot take it (said in one line).
    `compiled`: the loss calls the model through `torch.compile`."""
    model = fresh()
    switch = Switch(model)
    if label == PEFT_LORA:
        made = _peft_lora(model)
        if made is None:
            return None
        model = made
    elif label != FULL:
        spec = METHODS[label]
        try:
            delta.apply_delta(model, spec, seed=0)
        except UserError as error:
            print(f"{label}: skipped ({error})")
            return None
    call = torch.compile(model) if compiled else model
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if label in (FULL, PEFT_LORA):
        inputs = {k: v for k, v in data.items() if k != "labels"}
        return model, switch, lambda: supervised_loss(call(**inputs).logits, data["labels"]), trainable
    routing = torch.Generator().manual_seed(1)
    adamix = next((m for m in delta.parse_spec(spec).methods if m.method == "adamix"), None)
    consistency, mixed = (adamix.consistency if adamix else 0.0), delta.has_mixtures(model)
    return (model, switch, lambda: training_loss(call, dict(data), routing, consistency, mixed),
            delta.count_parameters(spec, model.config).trainable)


def _chosen(label: str, only: str | None) -> bool:
    return not only or label.startswith(tuple(only.split(",")))


def _peft_lora(model):
    """peft's LoRA r8 on this family's query and value, its head trained; None without peft."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return None
    from autopelt.delta.families import architecture_of

    arch = architecture_of(model.config)  # q,v of this family (BERT's query/value, Llama's q_proj/v_proj)
    targets = sorted({arch.linears[arch.aliases.get(s, s)].rsplit(".", 1)[-1] for s in ("query", "value")})
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets,
                                            modules_to_save=[arch.head]))


def machine() -> dict:
    """CPU model and flags (lscpu), torch's view of the CPU, the bf16 probe's verdict."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    except (OSError, subprocess.CalledProcessError):
        info = {}
    flags = info.get("Flags", "").split()
    return {"cpu_model": info.get("Model name", platform.processor()), "cpus": info.get("CPU(s)"),
            "flags": flags, "amx": any(f.startswith("amx") for f in flags), "avx512_bf16": "avx512_bf16" in flags,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "precision_note": devices.cpu_precision_note()}


def commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def ratios(results: dict) -> list[dict]:
    """Every row with its ratios: × its own fp32 step, × peft's LoRA and × the 2x-forward floor, both in the same
    precision and attention implementation (peft's LoRA also under the same backbone dropout). None where the
    reference was not measured."""
    seconds = {(r["configuration"], r["backbone_dropout"], r["attention"], r["precision"]): r["seconds"]
               for r in results["rows"]}
    rows = []
    for row in results["rows"]:
        label, mode, attention, precision = row["configuration"], row["backbone_dropout"], row["attention"], \
            row["precision"]
        fp32 = seconds.get((label, mode, attention, "fp32"))
        peft = seconds.get((PEFT_LORA, mode, attention, precision))
        forward = seconds.get((FORWARD, "–", attention, precision))
        rows.append({**row, "x_fp32": _over(row["seconds"], fp32 if precision != "fp32" else None),
                     "x_peft_lora": _over(row["seconds"], peft), "x_floor": _over(row["seconds"], 2 * forward
                                                                                   if forward else None)})
    return rows


def _over(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def header(results: dict) -> str:
    m = results["machine"]
    bf16 = ("AMX: bf16 rows measure the issue's ≤ 0.55× target" if m.get("amx") else
            "no AMX: the bf16 rows are AVX512-BF16's; the ≤ 0.55× bf16 target is for AMX machines, not measured on AMX "
            "here" if m.get("avx512_bf16") else "no native bf16: the bf16 rows are emulated")
    return (f"{results['model']} · seq {results['seq']} · batch {results['batch']} · {results['threads']} threads · "
            f"{results.get('statistic', 'median')} of {results['steps']} interleaved steps after {results['warmup']} "
            f"warm-up round(s) · "
            f"{m['cpu_model']} ({m.get('cpus')} CPUs, {bf16}) · torch {results['torch']} · commit {results['commit']} "
            f"· {results['date']}\n\n`{results['command']}`")


def table(results: dict) -> str:
    """One table per precision: a row per configuration and backbone dropout, per attention implementation the
    step in seconds, × fp32, × peft LoRA and × the 2x-forward floor."""
    rows = ratios(results)
    attentions = results["attentions"]
    parts = [header(results), overall_table(results), *filter(None, [compile_table(results)])]
    for precision in results["precisions"]:
        head = " | ".join(f"{a} s | × fp32 | × peft LoRA | × floor" for a in attentions)
        lines = [f"**{precision}**", "", f"| configuration | backbone dropout | trainable | {head} |",
                 "|---|---|---:|" + "---:|" * 4 * len(attentions)]
        by_key = {(r["configuration"], r["backbone_dropout"], r["attention"]): r
                  for r in rows if r["precision"] == precision}
        for label, mode in dict.fromkeys((r["configuration"], r["backbone_dropout"]) for r in rows
                                         if r["precision"] == precision):
            cells = []
            for attention in attentions:
                r = by_key.get((label, mode, attention))
                cells.append(" | ".join(["–"] * 4) if r is None else
                             f"{r['seconds']:.3f} | {_fmt(r['x_fp32'])} | {_fmt(r['x_peft_lora'])} | "
                             f"{_fmt(r['x_floor'])}")
            params = next((r["trainable_params"] for r in rows if r["configuration"] == label), None)
            lines.append(f"| {label} | {mode} | {f'{params:,}' if params else '–'} | {' | '.join(cells)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def overall(results: dict) -> list[tuple[str, str, float, int]]:
    """(precision, comparison, geometric mean of the step-time ratio over every training configuration measured
    both ways, how many): eager / sdpa, attention-off / model, off / model, bf16 / fp32. One cell of the tables
    can move by a fifth on a loaded machine; the mean over some twenty configurations moves less."""
    seconds = {(r["configuration"], r["backbone_dropout"], r["attention"], r["precision"]): r["seconds"]
               for r in results["rows"] if r["configuration"] != FORWARD}
    compiled = lambda k: k[0].endswith(COMPILED)  # noqa: E731
    comparisons = {"eager / sdpa": lambda k: (*k[:2], "eager", k[3]) if k[2] == "sdpa" else None,
                   "attention-off / model": lambda k: (k[0], "attention-off", *k[2:]) if k[1] == "model" else None,
                   "off / model": lambda k: (k[0], "off", *k[2:]) if k[1] == "model" else None,
                   "bf16 / fp32": lambda k: (*k[:3], "bf16") if k[3] == "fp32" else None}
    comparisons = {name: lambda k, other=other: None if compiled(k) else other(k)
                   for name, other in comparisons.items()}
    comparisons["compiled / eager"] = lambda k: None if compiled(k) else (k[0] + COMPILED, *k[1:])
    rows = []
    for name, other in comparisons.items():
        for precision in results["precisions"]:
            logs = [math.log(seconds[other(k)] / v) for k, v in seconds.items()
                    if other(k) in seconds and (k[3] == precision or name == "bf16 / fp32")]
            if logs and not (name == "bf16 / fp32" and precision != "fp32"):
                rows.append((precision if name != "bf16 / fp32" else "–", name, math.exp(sum(logs) / len(logs)),
                             len(logs)))
    return rows


def overall_table(results: dict) -> str:
    lines = ["| precision | step-time ratio | geometric mean over configurations | configurations |",
             "|---|---|---:|---:|"]
    lines += [f"| {p} | {name} | {ratio:.2f} | {n} |" for p, name, ratio, n in overall(results)]
    return "\n".join(lines)


def compile_table(results: dict) -> str:
    """Per compiled configuration: its compilation (first step minus a measured one), the step it saves over the
    eager one and the steps a trial needs to repay the compilation; empty when nothing was compiled."""
    rows = {(r["configuration"], r["backbone_dropout"], r["attention"], r["precision"]): r for r in results["rows"]}
    lines = ["| configuration | precision | compile s | eager step s | compiled step s | steps to repay |",
             "|---|---|---:|---:|---:|---:|"]
    for (label, mode, attention, precision), row in rows.items():
        eager = rows.get((label.removesuffix(COMPILED), mode, attention, precision))
        if not label.endswith(COMPILED) or eager is None or "first_seconds" not in row:
            continue
        cost, saved = row["first_seconds"] - row["seconds"], eager["seconds"] - row["seconds"]
        repay = f"{math.ceil(cost / saved):,}" if saved > 0 else "never"
        lines.append(f"| {label.removesuffix(COMPILED)} | {precision} | {cost:.1f} | {eager['seconds']:.3f} | "
                     f"{row['seconds']:.3f} | {repay} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def render(results: dict, doc: str, name: str = "step-times") -> str:
    """`doc` with the text between its `<!-- {name}:start -->` and `:end` markers replaced by the tables."""
    start, end = markers(name)
    if start not in doc or end not in doc:
        raise ValueError(f"the doc has no {start} ... {end} markers")
    before, rest = doc.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{table(results)}{end}{after}"


def newest_results() -> Path:
    """The newest results file of the default model (other models' files are named apart)."""
    found = sorted(RESULTS_DIR.glob("step_times-*.json"))
    if not found:
        raise SystemExit(f"no results in {RESULTS_DIR}: run bench/step_times.py first")
    return found[-1]


def render_main(argv: list[str]) -> None:
    """`step_times.py render [RESULTS.json] [--doc PAGE]`: the tables of a results file into a page's markers."""
    parser = argparse.ArgumentParser(prog="step_times.py render", description="put a results file's tables into a "
                                     "page between its step-times markers")
    parser.add_argument("results", nargs="?", type=Path, help="default: the newest step_times-*.json")
    parser.add_argument("--doc", type=Path, default=RESULTS_DIR.parents[1] / "docs" / "evidence" / "speed.md")
    parser.add_argument("--markers", default="step-times", help="the page's markers: <!-- NAME:start --> ... :end")
    args = parser.parse_args(argv)
    path = args.results or newest_results()
    args.doc.write_text(render(json.loads(path.read_text()), args.doc.read_text(), args.markers))
    print(f"wrote the tables of {path} into {args.doc}")


def main() -> None:
    if sys.argv[1:2] == ["render"]:
        return render_main(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", default=None, help="default: autopelt's default model")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated, among fp32, bf16, fp16")
    parser.add_argument("--dropouts", default=",".join(backbone.BACKBONE_DROPOUTS))
    parser.add_argument("--attentions", default=",".join(backbone.ATTENTIONS))
    parser.add_argument("--only", help="comma-separated starts of method names to time, e.g. lora,UniPELT "
                                       "(the forward, full fine-tuning and peft LoRA always run)")
    parser.add_argument("--method-settings", help="dropout/attention pairs for every method but LoRA and peft's "
                                                  "LoRA, e.g. model/sdpa,off/eager (default: all of them)")
    parser.add_argument("--statistic", choices=("median", "min"), default="median",
                        help="of each configuration's measured steps (min: the least disturbed by other load)")
    parser.add_argument("--compile", action="store_true",
                        help="every training configuration again under torch.compile (the first dropout and attention)")
    parser.add_argument("--out", help="the JSON results (default benchmarks/results/step_times-<date>.json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    split = lambda text: [p.strip() for p in text.split(",") if p.strip()]  # noqa: E731
    precisions, dropouts, attentions = split(args.precisions), split(args.dropouts), split(args.attentions)
    model = resolve_model(args.model)  # a folder, hub id or packaged name (smollm2-135m); default all-MiniLM-L6-v2
    steps, params = {}, {}
    for precision in precisions:
        pairs = [tuple(pair.split("/")) for pair in split(args.method_settings)] if args.method_settings else None
        built, params = build_steps(model, batch(args.seq, args.batch), devices.autocast_dtype(precision),
                                    dropouts, attentions, args.only, pairs, compile=args.compile)
        steps.update({(*key, precision): step for key, step in built.items()})
    times, first = interleaved(steps, args.steps, args.warmup)
    now = datetime.datetime.now(datetime.timezone.utc)
    results = {
        "command": " ".join(["python", *sys.argv]), "commit": commit(), "date": now.isoformat(timespec="seconds"),
        "machine": machine(), "torch": torch.__version__, "threads": args.threads, "model": model,
        "seq": args.seq, "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "statistic": args.statistic,
        "precisions": precisions, "dropouts": dropouts, "attentions": attentions,
        "rows": [{"configuration": label, "backbone_dropout": mode, "attention": attention, "precision": precision,
                  "trainable_params": params.get(label), "seconds": STATISTICS[args.statistic](values), "times": values,
                  "first_seconds": first[(label, mode, attention, precision)]}
                 for (label, mode, attention, precision), values in times.items()],
    }
    out = Path(args.out) if args.out else RESULTS_DIR / f"step_times-{now:%Y-%m-%d-%H%M}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    print(table(results))


if __name__ == "__main__":
    main()
