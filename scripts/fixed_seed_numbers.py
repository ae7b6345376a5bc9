"""The numbers a refactor must not change: one fixed-seed trial and one fixed-seed search, written as JSON.

    python scripts/fixed_seed_numbers.py OUT.json [--data-dir ../shared/data/glue]
    diff <(python -m json.tool before.json) <(python -m json.tool after.json)

Runs `autopelt train` (LoRA, sst2, K=64, 2 epochs, seed 0), `autopelt search` (sst2, K=64, 12 trials, one worker,
seed 0, a fresh SQLite study) on all-MiniLM-L6-v2 and two generation trials on SmolLM2-135M (E2E, K=32, batch 8,
2 epochs, LoRA: one at 1e-3, one sweeping its rate; `--generation-data-dir` the folder holding `e2e/`) in a
temporary folder, with this checkout's autopelt (so a worktree of the commit before the refactor gives the numbers
before), and writes what each trial recorded that a refactor could move: its configuration, learning rate and where
it came from, its state, dev history, dev and test metrics and the answer. Wall times and paths are left out: they
differ between any two runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("config", "learning_rate", "lr_from", "dev_metric", "test_metric", "metric", "params", "stopped_at_epoch",
        "epochs_run", "best_epoch", "status", "trainable_params", "stored_params", "dev", "test", "history", "steps")


def kept(result: dict) -> dict:
    """The fields of a result.json that a refactor must not change (those present; a rate sweep's candidates
    without their seconds)."""
    out = {key: result[key] for key in KEEP if key in result}
    if isinstance(result.get("lr_choice"), dict):
        out["lr_choice"] = {k: v for k, v in result["lr_choice"].items() if k != "seconds"}
    return out


AUTOPELT = [sys.executable, "-c", "import sys; from autopelt.cli import main; sys.exit(main())"]  # this checkout's


def run(command: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's autopelt, not the installed one
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"))
    parser.add_argument("--no-search", action="store_true", help="the trials alone (the search takes longest)")
    parser.add_argument("--generation-data-dir", default=str(ROOT.parent / "shared" / "data" / "gen"))
    args = parser.parse_args()
    numbers: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run([*AUTOPELT, "train", "--task", "sst2", "--k", "64", "--epochs", "2", "--seed", "0",
             "--method", "lora", "--data-dir", args.data_dir, "--out", str(work / "trial")], work)
        numbers["trial"] = kept(json.loads((work / "trial" / "result.json").read_text()))
        if not args.no_search:
            run([*AUTOPELT, "search", "--task", "sst2", "--k", "64", "--budget", "12", "--seed", "0",
                 "--workers", "1", "--data-dir", args.data_dir, "--storage", f"sqlite:///{work / 'study.db'}",
                 "--out", str(work / "search")], work)
        trials = {}
        for result in sorted((work / "search").rglob("result.json")):
            trials[str(result.parent.relative_to(work / "search"))] = kept(json.loads(result.read_text()))
        numbers["search"] = trials
        for name, rate in (("generation", ["--lr", "1e-3"]), ("generation-swept", [])):
            run([*AUTOPELT, "train", "--task", "e2e", "--data-dir", args.generation_data_dir, "--input-column", "mr",
                 "--target-column", "ref", "--model", "smollm2-135m", "--k", "32", "--batch-size", "8", "--epochs",
                 "2", "--seed", "0", "--method", "lora", "--max-new-tokens", "12", *rate,
                 "--out", str(work / name)], work)
            numbers[name] = kept(json.loads((work / name / "result.json").read_text()))
        answer = work / "search" / "answer.json"
        if answer.exists():
            numbers["answer"] = json.loads(answer.read_text())
    args.out.write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: 1 trial, {len(numbers['search'])} search trials, 2 generation trials")


if __name__ == "__main__":
    main()
