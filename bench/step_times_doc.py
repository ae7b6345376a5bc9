"""Render bench/step_times.py's JSON results as markdown tables, and put them into docs/speed.md between its markers.

Usage: python bench/step_times_doc.py [RESULTS.json] [--doc docs/speed.md]   (default: the newest results file)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
START, END = "<!-- step-times:start -->", "<!-- step-times:end -->"
FORWARD, PEFT_LORA = "frozen forward", "peft LoRA r8 (q,v)"


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
    parts = [header(results), overall_table(results)]
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
    comparisons = {"eager / sdpa": lambda k: (*k[:2], "eager", k[3]) if k[2] == "sdpa" else None,
                   "attention-off / model": lambda k: (k[0], "attention-off", *k[2:]) if k[1] == "model" else None,
                   "off / model": lambda k: (k[0], "off", *k[2:]) if k[1] == "model" else None,
                   "bf16 / fp32": lambda k: (*k[:3], "bf16") if k[3] == "fp32" else None}
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


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def render(results: dict, doc: str) -> str:
    """`doc` with the text between its step-times markers replaced by the tables."""
    if START not in doc or END not in doc:
        raise ValueError(f"the doc has no {START} ... {END} markers")
    before, rest = doc.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{table(results)}{END}{after}"


def newest() -> Path:
    found = sorted(RESULTS_DIR.glob("step_times-*.json"))  # the default model's; other models' are named apart
    if not found:
        raise SystemExit(f"no results in {RESULTS_DIR}: run bench/step_times.py first")
    return found[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path)
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "speed.md")
    args = parser.parse_args()
    results = json.loads((args.results or newest()).read_text())
    args.doc.write_text(render(results, args.doc.read_text()))
    print(f"wrote the tables of {args.results or newest()} into {args.doc}")


if __name__ == "__main__":
    main()
