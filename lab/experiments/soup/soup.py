"""The soup against the ensemble it stands in for: one LoRA configuration trained at several seeds, then
  single    each seed's delta alone (the mean over seeds, and the worst seed)
  ensemble  the seeds' probabilities averaged (the equal-cost seed ensemble: one forward pass a member)
  soup      the seeds' deltas averaged into one (autopelt/ensemble/soup.py: ΔW = s·B·A averaged exactly, the head's
            weights averaged), merged into the backbone: one forward pass
on the meta-dataset's protocol (K = 1,000 rows of a task's pool, its dev and test, 3 epochs, data seed 0). The
configuration is the shipped portfolio's first member, the delta a search trains first. Dev and test of each arm,
and the seconds of one forward pass over the test split (merged LoRA, this process's threads, the fastest of
three).

Trials are kept under --runs (result.json, predictions.npz and delta/ each) and a rerun trains only what is missing.

    python lab/experiments/soup/soup.py --pool /tmp/pool [--tasks sst2,trec,tweeteval_emotion] [--seeds 0,1,2,3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the meta-dataset's pipeline: never installed
from results import ROOT, write_results  # noqa: E402

CONFIG = "lora-r8-qv-ffn-b16@2e-3"


def train(task: str, seed: int, pool: str, runs: Path, threads: int) -> dict:
    """The trial of CONFIG on `task` at `seed`, trained once (its folder kept) and read back after."""
    from metalearning.collect import EPOCHS, K, dev_size, pool_task
    from metalearning.design import config_named
    from transformers import AutoConfig

    from autopelt.models import resolve_model
    from autopelt.train import TrialSettings, run_trial

    out = runs / task / f"s{seed}"
    done = out / "result.json"
    if done.is_file() and json.loads(done.read_text()).get("status") == "ok":
        return json.loads(done.read_text())
    config = config_named(CONFIG)
    model = resolve_model("all-MiniLM-L6-v2")
    settings = TrialSettings(
        task=task, spec=config.spec(AutoConfig.from_pretrained(model).num_hidden_layers), model=model,
        data_dir=pool, protocol=K, dev_size=dev_size(pool, task), seed=seed, data_seed=0, epochs=EPOCHS,
        learning_rate=config.learning_rate, head_lr_scale=config.head_lr_scale, batch_size=config.batch_size,
        custom_task=pool_task(pool, task), threads=threads, device="cpu", precision="fp32",
        backbone_dropout=config.backbone_dropout, out_dir=str(out), keep_predictions=True)
    started = time.time()
    result = run_trial(settings)
    if result["status"] != "ok":
        raise SystemExit(f"{task} seed {seed}: {result['reason']}")
    print(f"  trained {task} seed {seed} in {time.time() - started:.0f}s: dev {result['dev_metric']:.4f}", flush=True)
    return json.loads(done.read_text())


def outputs(result: dict, delta_dir: str, data, task) -> tuple[dict, float]:
    """{split: probabilities (or values)} of the delta in `delta_dir` merged into the base model, on the trial's
    dev and test features; and the seconds of the test forward pass."""
    import torch

    import autopelt
    from autopelt.train import TrialSettings
    from autopelt.train.classify import forward_split
    from autopelt.train.predictions import from_outputs

    settings = TrialSettings.from_dict(result["settings"])
    model = autopelt.load(None, delta_dir, merge=True)
    found = {split: from_outputs(forward_split(model, getattr(data, split), settings, torch.device("cpu"), None),
                                 task.regression) for split in ("dev", "test")}
    seconds = []
    for _ in range(3):  # the fastest of three: the machine's other work only ever slows a pass
        started = time.perf_counter()
        forward_split(model, data.test, settings, torch.device("cpu"), None)
        seconds.append(time.perf_counter() - started)
    return found, min(seconds)


def score(task, probabilities: np.ndarray, labels) -> float:
    import torch

    values = probabilities if task.regression else np.log(np.clip(probabilities, 1e-12, None))
    return float(task.compute_metrics(torch.as_tensor(values, dtype=torch.float32), labels)[task.metric])


def one_task(task_name: str, seeds: list[int], pool: str, runs: Path, threads: int) -> dict:
    import torch

    from autopelt.ensemble.soup import soup_folders
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data, resolve_task

    torch.set_num_threads(threads)
    results = [train(task_name, seed, pool, runs, threads) for seed in seeds]
    settings = TrialSettings.from_dict(results[0]["settings"])
    task = resolve_task(settings)
    data = prepare_data(settings, load_tokenizer(resolve_model(settings.model)), task)
    members, member_seconds = [], []
    for result in results:
        found, seconds = outputs(result, result["delta_dir"], data, task)
        members.append(found)
        member_seconds.append(seconds)
    soup_dir = runs / task_name / "soup"
    soup_folders([r["delta_dir"] for r in results], [1.0] * len(results), soup_dir)
    soup, soup_seconds = outputs(results[0], str(soup_dir), data, task)
    row = {"task": task_name, "metric": task.metric, "seeds": len(seeds)}
    for split in ("dev", "test"):
        labels = getattr(data, split).labels
        singles = [score(task, m[split], labels) for m in members]
        row[f"single_{split}"] = round(100 * statistics.mean(singles), 2)
        row[f"single_worst_{split}"] = round(100 * min(singles), 2)
        averaged = np.mean([m[split].astype(np.float64) for m in members], axis=0)
        row[f"ensemble_{split}"] = round(100 * score(task, averaged, labels), 2)
        row[f"soup_{split}"] = round(100 * score(task, soup[split], labels), 2)
    row["member_forward_s"] = round(statistics.mean(member_seconds), 3)
    row["ensemble_forward_s"] = round(sum(member_seconds), 3)
    row["soup_forward_s"] = round(soup_seconds, 3)
    return row


COLUMNS = ["task", "metric", "seeds", "single_test", "single_worst_test", "ensemble_test", "soup_test", "single_dev",
           "ensemble_dev", "soup_dev", "member_forward_s", "ensemble_forward_s", "soup_forward_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool", required=True,
                        help="a folder written by `PYTHONPATH=lab python -m metalearning pool`")
    parser.add_argument("--tasks", default="sst2,trec,tweeteval_emotion")
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", default=str(ROOT / "bench_runs" / "soup"), help="where the trials are kept")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--name", default="soup")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    started = time.time()
    rows = []
    for task in args.tasks.split(","):
        rows.append(one_task(task, seeds, args.pool, Path(args.runs), args.threads))
        print(json.dumps(rows[-1]), flush=True)
    mean = {"task": "mean", "metric": "", "seeds": len(seeds),
            **{c: round(statistics.mean(r[c] for r in rows), 3 if c.endswith("_s") else 2) for c in COLUMNS[3:]}}
    rows.append(mean)
    notes = (f"soup {mean['soup_test'] - mean['ensemble_test']:+.2f} test vs the {len(seeds)}-seed ensemble and "
             f"{mean['soup_test'] - mean['single_test']:+.2f} vs one seed (mean), at "
             f"{mean['soup_forward_s'] / mean['ensemble_forward_s']:.2f}x the ensemble's forward time")
    path = write_results(args.name, rows, columns=COLUMNS, precision="fp32 (CPU)", out_dir=args.out,
                         settings={"config": CONFIG, "tasks": args.tasks, "seeds": seeds, "threads": args.threads,
                                   "pool": args.pool, "seconds": round(time.time() - started, 1)}, notes=notes)
    for row in rows:
        print("  ".join(f"{c}={row[c]}" for c in COLUMNS))
    print(notes)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
