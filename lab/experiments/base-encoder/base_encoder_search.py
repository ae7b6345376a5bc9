"""The same default search on a base-size encoder and on MiniLM: wall time, trials, answer, test beside the floor.

Runs `autopelt search --model M --task T --k K --data-dir D --budget B --seed S` for each model and seed, one after
the other on this machine (nothing else set: default workers, precision, portfolio and rates), keeps its printed
summary (`search.txt`), then `autopelt export` of its answer (`metrics.json`: dev, test, one-class floors, the
study's ensemble with its test). Prints and writes (`base-encoder-search`) one row per model and seed. A model and
seed whose search and export finished before is kept (resumable); a search killed midway resumes as `autopelt
search` resumes. Each row names the commit its search ran at (`commit.txt` in its folder).

    python lab/experiments/base-encoder/base_encoder_search.py --models mpnet-base,all-MiniLM-L6-v2 --seeds 0 \\
        --data-dir ../shared/data/glue --work-dir /tmp/base-encoder
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout; the lab is ROOT / "lab"


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from results import write_results

    work = Path(args.work_dir).resolve()
    rows = [one(args, model, int(seed), work) for seed in args.seeds.split(",") for model in args.models.split(",")]
    for row in rows:
        print(f"{row['model']:>18} seed {row['seed']}: {row['wall_s']:.0f} s, {row['trials']} trials, answer "
              f"{row['answer']}: dev {row['dev']:.4f} test {row['test']:.4f} (one-class floor: dev "
              f"{row['floor_dev']:.4f} test {row['floor_test']:.4f}); ensemble "
              f"{_maybe(row['ensemble_test'])} over {row['ensemble_members']} members")
    columns = [key for key in rows[0] if key != "summary"]  # the summaries stay in the file, out of the table
    write_results("base-encoder-search", rows, columns=columns, settings={
        "task": args.task, "k": args.k, "budget": args.budget, "data_dir": args.data_dir, "models": args.models,
        "seeds": args.seeds}, notes=" ".join(filter(None, [
            "one search at a time, each with its defaults; test never chose anything.", args.note])),
        out_dir=Path(__file__).parent)


def one(args, model: str, seed: int, work: Path) -> dict:
    """One model and seed: its search (timed, summary kept) and its answer's export, each kept once done."""
    here = work / f"{model.replace('/', '_')}-s{seed}"
    here.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{here / 'study.db'}"
    env = {**os.environ, "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = here / "search.done"
    if not done.exists():
        (here / "commit.txt").write_text(_commit())
        command = [sys.executable, "-m", "autopelt.cli", "search", "--model", model, "--task", args.task,
                   "--data-dir", args.data_dir, "--k", str(args.k), "--budget", args.budget, "--seed", str(seed),
                   "--storage", storage, "--study-name", "default", "--out", str(here / "out")]
        print(f"$ {' '.join(command[2:])}", flush=True)
        started = time.perf_counter()
        with open(here / "search.txt", "a") as log:
            subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
        done.write_text(f"{time.perf_counter() - started:.1f}")
    export = here / "export"
    if not (export / "metrics.json").exists():
        command = [sys.executable, "-m", "autopelt.cli", "export", "--storage", storage, "--study", "default",
                   "--out", str(export)]
        print(f"$ {' '.join(command[2:])}", flush=True)
        subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads((export / "metrics.json").read_text())
    name = metrics.get("metric", "accuracy")
    ensemble = metrics.get("ensemble") or {}
    commit = here / "commit.txt"
    return {"model": model, "seed": seed, "commit": commit.read_text().strip() if commit.exists() else None,
            "wall_s": float(done.read_text()), "trials": trials_of(storage),
            "answer": metrics.get("baseline") or f"trial {metrics.get('trial')}", "metric": name,
            "dev": metrics["dev"][name], "test": metrics["test"][name],
            "floor_dev": metrics["floors"]["dev"], "floor_test": metrics["floors"]["test"],
            "ensemble_members": ensemble.get("members"), "ensemble_answers": ensemble.get("answers"),
            "ensemble_dev": ensemble.get("dev"), "ensemble_test": ensemble.get("test"),
            "summary": _summary(here / "search.txt")}


def _summary(log: Path) -> list[str]:
    """The search's printed summary: its log from the last line that starts it ('study <name>: ...') on."""
    lines = log.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("study default:")]
    return lines[starts[-1]:] if starts else lines[-40:]


def _commit() -> str:
    """The commit the search runs at (bench/results.py's form: `+dirty` where tracked files differ)."""
    from results import commit

    return commit()


def _maybe(value) -> str:
    return "test -" if value is None else f"test {value:.4f}"


def trials_of(storage: str) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return len(optuna.load_study(study_name="default", storage=storage).trials)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mpnet-base,all-MiniLM-L6-v2", help="comma-separated --model values")
    parser.add_argument("--seeds", default="0", help="comma-separated search seeds (another seed: other K rows)")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--k", type=int, default=500)
    parser.add_argument("--budget", default="45m", help="the search's --budget")
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--note", help="a sentence the results file keeps (what else ran on the machine, say)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
