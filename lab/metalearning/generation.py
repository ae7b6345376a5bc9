"""A generation design and the portfolio a generation search starts from, learned from measured trials.

The design (`DESIGN`): LoRA r8 on query/value and on every linear layer, r16 on every linear layer, Pfeiffer and
Houlsby adapters, a prefix and (IA)^3, each at two or three rates: 15 configurations a language-model delta can
take on a decoder (no BitFit: Llama has no biases). `collect` trains each on a generation task's rows (the K-row protocol of autopelt train:
dev carved by input, every epoch's dev loss; test BLEU and ROUGE-L of the kept state, for reporting) and appends a
record a trial to a JSON Lines file (resumable). `build` ranks the configurations by their mean dev loss over the
runs collected (task and seed; lower first; test never read) and writes a portfolio file of kind "generation" for
that model, which `autopelt search --portfolio FILE` on a generation task runs first.

    python -m metalearning generation-collect --data-dir ../shared/data/gen --task e2e --input-column mr \\
        --target-column ref --model smollm2-135m --results gen.jsonl [--seeds 0,1] [--k 1000]
    python -m metalearning generation-build --results gen.jsonl --out portfolio-generation-smollm2-135m.json
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
from pathlib import Path

from autopelt.errors import UserError
from autopelt.portfolio.config import Config, rate_text

EPOCHS, BATCH, MAX_LENGTH, MAX_NEW_TOKENS = 3, 16, 96, 40
_QV, _ALL = ["query", "value"], ["query", "key", "value", "attention_output", "intermediate", "output"]
LORA = {"method": "lora", "rank": 8, "alpha": 16, "targets": _QV}
DESIGN_VERSION = 1


def _rates(name: str, methods: list[dict], rates: tuple[float, ...]) -> list[Config]:
    return [Config(f"{name}@{rate_text(rate)}", tuple(methods), rate, batch_size=BATCH, pooling="cls")
            for rate in rates]


DESIGN: tuple[Config, ...] = (
    *_rates("lora-r8-qv", [LORA], (3e-4, 1e-3, 3e-3)),
    *_rates("lora-r8-all", [{**LORA, "targets": _ALL}], (3e-4, 1e-3)),
    *_rates("lora-r16-all", [{**LORA, "rank": 16, "alpha": 32, "targets": _ALL}], (3e-4, 1e-3)),
    *_rates("pfeiffer-48", [{"method": "adapter", "placement": "pfeiffer", "bottleneck": 48}], (3e-4, 1e-3)),
    *_rates("houlsby-16", [{"method": "adapter", "placement": "houlsby", "bottleneck": 16}], (3e-4, 1e-3)),
    *_rates("prefix-10", [{"method": "prefix", "length": 10}], (1e-3, 3e-3)),
    *_rates("ia3", [{"method": "ia3", "targets": ["key", "value", "output"]}], (3e-3, 1e-2)),
)
BY_NAME = {config.name: config for config in DESIGN}


def config_named(name: str) -> Config:
    if name not in BY_NAME:
        raise UserError(f"unknown generation configuration {name!r}; one of {', '.join(BY_NAME)}")
    return BY_NAME[name]


def run_job(job: tuple[str, int], task: dict, model: str, device: str | None, precision: str,
            threads: int | None) -> dict:
    """One trial of the design (job: configuration name, seed) as a compact record."""
    from transformers import AutoConfig

    from autopelt.train import TrialSettings, run_trial

    name, seed = job
    config = config_named(name)
    layers = AutoConfig.from_pretrained(model).num_hidden_layers
    settings = TrialSettings(
        task=task["task"], spec=config.spec(layers), model=model, data_dir=task["data_dir"], protocol=task["k"],
        seed=seed, data_seed=0, epochs=EPOCHS, learning_rate=config.learning_rate, batch_size=config.batch_size,
        max_length=MAX_LENGTH, max_new_tokens=MAX_NEW_TOKENS, threads=threads, device=device, precision=precision,
        custom_task={"input_column": task["input_column"], "target_column": task["target_column"]}, score_test=True)
    result = run_trial(settings)
    params = result.get("params") or {}
    return {"task": task["task"], "config": name, "seed": seed, "status": result["status"],
            "reason": result.get("reason"),
            "epochs": [{"dev_loss": round(e["dev_loss"], 5)} for e in result.get("history") or []],
            "dev_loss": (result.get("dev") or {}).get("loss"), "test": result.get("test"),
            "params": params.get("stored"), "params_percent": params.get("stored_pct"),
            "total_seconds": round(result.get("total_seconds") or 0.0, 3), "precision": result.get("precision"),
            "peak_memory_mb": result.get("peak_memory_mb")}


def _work(payload) -> dict | None:
    job, deadline, kwargs = payload
    if deadline is not None and time.time() > deadline:
        return None
    return run_job(job, **kwargs)


def collect(task: dict, results: str | Path, model: str, configs: list[str], seeds: list[int], workers: int = 1,
            device: str | None = None, precision: str = "auto", threads: int | None = None,
            deadline: float | None = None, say=print) -> int:
    """Train every (configuration, seed) not yet in `results`, seed by seed; returns how many ran. `task`: its
    name, data folder, columns and K."""
    results = Path(results)
    done = set()
    if results.exists():
        done = {(r["task"], r["config"], r["seed"]) for r in map(json.loads, filter(str.strip,
                                                                                  results.read_text().splitlines()))}
    for name in configs:
        config_named(name)
    todo = [(c, s) for s in seeds for c in configs if (task["task"], c, s) not in done]
    say(f"{len(configs) * len(seeds) - len(todo)} trials already in {results}; running {len(todo)} on {workers}")
    kwargs = {"task": task, "model": model, "device": device, "precision": precision, "threads": threads}
    ran, started = 0, time.time()
    with multiprocessing.get_context("spawn").Pool(workers) as pool, results.open("a") as out:
        for record in pool.imap_unordered(_work, [(job, deadline, kwargs) for job in todo]):
            if record is None:
                continue
            out.write(json.dumps(record) + "\n")
            out.flush()
            ran += 1
            say(f"[{ran}/{len(todo)} {time.time() - started:.0f}s] {record['config']} seed {record['seed']}: "
                f"{record['status']} dev loss {record['dev_loss'] if record['dev_loss'] is not None else '-'} "
                f"test {record['test']} ({record['total_seconds']:.0f}s)")
    return ran


def ranking(records: list[dict]) -> list[tuple[str, float, int]]:
    """(configuration, mean dev loss, runs) over the runs (task, seed) that at least half of the configurations
    reached (a seed cut short, with fewer, is not one), lowest loss first. A configuration that failed or is
    missing at one of them is left out: a user trains the answer once, and it must train."""
    reached: dict[tuple, set] = {}
    losses: dict[str, dict[tuple, float]] = {}
    for record in records:
        run = (record["task"], record["seed"])
        reached.setdefault(run, set()).add(record["config"])
        if record["status"] == "ok" and record.get("dev_loss") is not None:
            losses.setdefault(record["config"], {})[run] = record["dev_loss"]
    configs = set().union(*reached.values()) if reached else set()
    runs = {run for run, seen in reached.items() if 2 * len(seen) >= len(configs)}
    whole = [(c, statistics.fmean(by_run[run] for run in runs), len(runs)) for c, by_run in losses.items()
             if runs and runs <= set(by_run)]
    return sorted(whole, key=lambda entry: entry[1])


def build(results: str | Path, out: str | Path, model: str, size: int = 8) -> dict:
    """Write the generation portfolio: the `size` configurations of the lowest mean dev loss (`ranking`)."""
    from autopelt.portfolio.portfolio import to_file

    path = Path(results)
    if not path.is_file():
        raise UserError(f"--results {path}: no such file; collect first")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ranked = ranking(records)
    if not ranked:
        raise UserError(f"{path} holds no configuration trained at every seed collected")
    tasks = sorted({r["task"] for r in records})
    members = [config_named(name) for name, _, _ in ranked[:size]]
    built_from = {"tasks": tasks, "seeds": sorted({r["seed"] for r in records}), "design_version": DESIGN_VERSION,
                  "selection": f"mean dev loss over {ranked[0][2]} runs (task, seed; test never read)",
                  "dev_loss": {name: round(loss, 5) for name, loss, _ in ranked[:size]}}
    return to_file(members, model, built_from, out, design_version=None, extra={"task_kind": "generation"})
