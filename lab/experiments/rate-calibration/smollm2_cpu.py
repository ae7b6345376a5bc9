"""Calibrated against absolute rates on a second model, SmolLM2-135M-Instruct as a classifier, on a CPU: a small
first look at issue 47's question (the full comparison, leave-one-task-out over 8 tasks and a 24-configuration
design, needs a GPU).

For each task and seed: LoRA r8 (q,v) with its rate swept on SmolLM2 (the live sweep, train/lr_sweep.py): its rate
is the calibration. Then the shipped portfolio's first members, each at its recorded rate (absolute: what a search
on another model did before calibration) and at that rate times the calibration over the portfolio's reference
rate (calibrated: what `autopelt search --rates auto` does now). The meta-dataset's protocol at a smaller K (the
pool's first K training rows, its first DEV dev rows, 3 epochs), dev selects nothing here: each arm is one
configuration at one rate, scored on test.

    python lab/experiments/rate-calibration/smollm2_cpu.py run --pool POOL [--tasks sst2,trec] [--seeds 0,1]
    python lab/experiments/rate-calibration/smollm2_cpu.py report

`run` appends every trial to smollm2-trials.jsonl beside this file (a killed run goes on where it stopped);
`report` writes smollm2-calibration-<date>.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRIALS = HERE / "smollm2-trials.jsonl"
MODEL = "smollm2-135m"
K, DEV, EPOCHS, MAX_LENGTH = 200, 300, 3, 64
MEMBERS = 2  # the shipped portfolio's first members (its global order): a LoRA and an adapter


def _settings(pool: str, task: str, seed: int, spec: dict, rate: float | None, batch: int, head: float,
              dropout: str, out: Path):
    from autopelt.models import resolve_model
    from autopelt.train import TrialSettings
    from metalearning.tasks import pool_task

    return TrialSettings(task=task, spec=spec, model=resolve_model(MODEL), data_dir=pool, protocol=K, dev_size=DEV,
                         seed=seed, data_seed=0, epochs=EPOCHS, learning_rate=rate, head_lr_scale=head,
                         batch_size=batch, custom_task=pool_task(pool, task), backbone_dropout=dropout,
                         max_length=MAX_LENGTH, out_dir=str(out), precision="fp32")


def _done() -> dict:
    if not TRIALS.exists():
        return {}
    rows = [json.loads(line) for line in TRIALS.read_text().splitlines() if line.strip()]
    return {(r["task"], r["seed"], r["arm"]): r for r in rows}


def _train(settings) -> dict:
    from autopelt.train import run_trial

    started = time.time()
    result = run_trial(settings)
    if result["status"] != "ok":
        raise SystemExit(f"{settings.task}: {result.get('reason')}")
    return {"dev": result["dev_metric"], "test": result["test"][result["metric"]],
            "rate": result["learning_rate"], "seconds": round(time.time() - started, 1),
            "lr_choice": result.get("lr_choice")}


def run(args) -> None:
    from autopelt.models import own_pooling, resolve_model
    from autopelt.portfolio.portfolio import SHIPPED, load
    from autopelt.search.baselines import baseline_spec
    from transformers import AutoConfig

    from autopelt.search.space_models import portfolio_for_model

    model_config = AutoConfig.from_pretrained(resolve_model(MODEL))
    portfolio, _ = portfolio_for_model(load(SHIPPED), model_config)  # as a search takes it: the last token read
    reference = portfolio.reference_rate
    layers = model_config.num_hidden_layers
    done = _done()
    scratch = Path(args.scratch)
    for seed in map(int, args.seeds.split(",")):
        for task in args.tasks.split(","):
            def record(arm: str, settings, **extra) -> dict:
                if (task, seed, arm) in done:
                    return done[(task, seed, arm)]
                row = {"task": task, "seed": seed, "arm": arm, **extra, **_train(settings)}
                with TRIALS.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
                done[(task, seed, arm)] = row
                return row

            lora = record("lora sweep", _settings(args.pool, task, seed, baseline_spec("lora", own_pooling(resolve_model(MODEL))), None, 32, 1.0,
                                                  "off", scratch / f"{task}-{seed}-lora"))
            for member in portfolio.members[:MEMBERS]:
                for how, rate in (("absolute", member.learning_rate),
                                  ("calibrated", member.learning_rate * lora["rate"] / reference)):
                    record(f"{member.name} {how}", _settings(args.pool, task, seed, member.spec(layers), rate,
                                                             member.batch_size, member.head_lr_scale,
                                                             member.backbone_dropout,
                                                             scratch / f"{task}-{seed}-{member.name}-{how}"),
                           member=member.name, how=how)


def report(args) -> None:
    sys.path.insert(0, str(HERE.parents[2] / "bench"))
    from results import write_results

    done = _done()
    keys = sorted({(t, s) for t, s, _ in done})
    members = sorted({r["member"] for r in done.values() if r.get("member")})
    rows = []
    for task, seed in keys:
        lora = done.get((task, seed, "lora sweep"))
        row = {"task": task, "seed": seed, "lora rate": lora and lora["rate"],
               "lora test": lora and round(100 * lora["test"], 2)}
        for member in members:
            for how in ("absolute", "calibrated"):
                r = done.get((task, seed, f"{member} {how}"))
                row[f"{member} {how}"] = r and round(100 * r["test"], 2)
        rows.append(row)
    complete = [r for r in rows if all(v is not None for v in r.values())]
    if complete:
        mean = {"task": "mean", "seed": f"{len(complete)} runs", "lora rate": math.exp(statistics.mean(
            math.log(r["lora rate"]) for r in complete))}
        for key in list(complete[0])[3:]:
            mean[key] = round(statistics.mean(r[key] for r in complete), 2)
        rows.append(mean)
    for row in rows:
        print(" | ".join(f"{v:.3g}" if isinstance(v, float) and v < 1 else str(v) for v in row.values()))
    write_results("smollm2-calibration", rows, precision="fp32",
                  settings={"model": MODEL, "k": K, "dev": DEV, "epochs": EPOCHS, "max_length": MAX_LENGTH,
                            "members": members, "trials": list(done.values())},
                  notes="test accuracy (%) on SmolLM2-135M-Instruct (fp32, CPU) of the shipped portfolio's first "
                        "members at their MiniLM rates (absolute) and calibrated to the LoRA rate swept on SmolLM2 "
                        "for the task and seed; lora test: the sweep's own answer", out_dir=HERE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    go = sub.add_parser("run")
    go.add_argument("--pool", required=True)
    go.add_argument("--tasks", default="sst2,trec")
    go.add_argument("--seeds", default="0,1")
    go.add_argument("--scratch", default="/tmp/smollm2-calibration")
    sub.add_parser("report")
    args = parser.parse_args()
    run(args) if args.action == "run" else report(args)


if __name__ == "__main__":
    main()
