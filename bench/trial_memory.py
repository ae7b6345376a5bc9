"""Peak host memory of one trial, as `autopelt train` runs it, against a target per row:

- SmolLM2-135M (`--model smollm2-135m`) generation on E2E NLG, K=200 rows, 1 epoch, LoRA r8: target 3 GB (a trial
  peaked at 12.4 GB before its loss computed the LM head at the target positions alone);
- all-mpnet-base-v2 (`--model mpnet-base`, or a folder) classification on SST-2, K=500, 1 epoch, LoRA r8: target
  2.5 GB.

Each trial runs in its own process (the CLI, as a user runs it), so two peaks are read: the trial's own record
(result.json's `peak_host_memory_mb`, from data to test scores; `peak_host_memory_by` says whether it is the
process's ru_maxrss, which the trial raised, or resident memory sampled by a thread) and the whole process's
maximum resident memory (os.wait4 on the child: imports and the model's first conversion included). A fixed
learning rate (`--lr`) trains one run, not a sweep of several on the same shapes (the same peak, more time).
`--pythonpath DIR` runs the trials on another checkout's code (the code before a change, for a before/after).
The results go to benchmarks/results/trial-memory-<date>.json (bench/results.py), printed too.

    python bench/trial_memory.py [--only generation|classification] [--precision auto] [--threads 2]
        [--mpnet mpnet-base] [--gen-data-dir ../shared/data/gen] [--glue-dir ../shared/data/glue]
        [--pythonpath DIR --label before] [--out benchmarks/results] [-- extra train flags]

Flags after `--` go to every trial (`-- --gradient-checkpointing --label checkpointing`: a variant row).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import ROOT, write_results

COLUMNS = ["trial", "label", "status", "precision", "peak_host_mb", "peak_by", "process_max_rss_mb", "target_mb",
           "within_target", "seconds", "reason"]
SHARED = ROOT.parent / "shared" / "data"


def trials(args) -> dict[str, dict]:
    """name -> the `autopelt train` arguments of the trial and its target (MiB)."""
    return {
        "smollm2-135m e2e generation K=200": {
            "target_mb": 3 * 1024, "args": [
                "--task", "e2e", "--input-column", "mr", "--target-column", "ref", "--data-dir", args.gen_data_dir,
                "--model", "smollm2-135m", "--k", "200", "--epochs", "1", "--method", "lora", "--rank", "8",
                "--lr", str(args.gen_lr)]},
        "mpnet-base sst2 classification K=500": {
            "target_mb": 2.5 * 1024, "args": [
                "--task", "sst2", "--data-dir", args.glue_dir, "--model", args.mpnet, "--k", "500", "--epochs", "1",
                "--method", "lora", "--rank", "8", "--lr", str(args.cls_lr)]},
    }


def run_one(name: str, trial: dict, args, work: Path) -> dict:
    """One trial in a child process: its result.json's peaks and the child's own maximum resident memory."""
    out = work / name.split()[0]
    command = [*args.autopelt, "train", *trial["args"], "--precision", args.precision, "--threads", str(args.threads),
               "--out", str(out), *args.extra]
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pythonpath, env.get("PYTHONPATH")]))
    print(f"{name}: {' '.join(command)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(work / f"{out.name}.log", "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=args.cwd)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    row = {"trial": name, "label": args.label, "status": f"exit {os.waitstatus_to_exitcode(status)}",
           "precision": None, "peak_host_mb": None, "peak_by": None,
           "process_max_rss_mb": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
           "target_mb": trial["target_mb"], "within_target": None, "seconds": round(seconds, 1), "reason": None}
    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        lines = (work / f"{out.name}.log").read_text().strip().splitlines()
        row["reason"] = lines[-1][-300:] if lines else "no result.json"
        return row
    peak = result.get("peak_host_memory_mb", result.get("peak_memory_mb"))  # older code: the one field
    row.update(status=result["status"], precision=result.get("precision"), reason=result.get("reason"),
               peak_host_mb=round(peak, 1) if peak is not None else None,
               peak_by=result.get("peak_host_memory_by", "sampled (older code)"))
    if peak is not None:
        row["within_target"] = peak <= trial["target_mb"]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["generation", "classification"])
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mpnet", default=os.environ.get("AUTOPELT_BENCH_MPNET", "mpnet-base"),
                        help="the MPNet model: a short name or a folder (env AUTOPELT_BENCH_MPNET)")
    parser.add_argument("--gen-data-dir", default=str(SHARED / "gen"))
    parser.add_argument("--glue-dir", default=str(SHARED / "glue"))
    parser.add_argument("--gen-lr", type=float, default=1e-3)
    parser.add_argument("--cls-lr", type=float, default=2e-3)
    parser.add_argument("--pythonpath", help="run the trials on this checkout's code (a before/after)")
    parser.add_argument("--label", default="this commit")
    parser.add_argument("--work-dir", help="where the trials write (default: a temporary folder)")
    parser.add_argument("--autopelt", default="autopelt", help="the command that runs autopelt (tests: a stand-in)")
    parser.add_argument("--out", help="results folder (default benchmarks/results)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # what follows goes to every trial
    args = parser.parse_args(argv[:cut])
    args.autopelt, args.extra = args.autopelt.split(), argv[cut + 1:]
    args.cwd = tempfile.gettempdir()  # not the checkout: the trials import the code on PYTHONPATH, else the install
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="trial-memory."))
    work.mkdir(parents=True, exist_ok=True)
    chosen = {name: trial for name, trial in trials(args).items()
              if not args.only or args.only in name}
    rows = [run_one(name, trial, args, work) for name, trial in chosen.items()]
    precisions = sorted({row["precision"] for row in rows if row["precision"]})
    name = "trial-memory" if args.label == "this commit" else f"trial-memory-{re.sub('[^a-z0-9]+', '-', args.label)}"
    path = write_results(
        name, rows, COLUMNS, precision="/".join(precisions) or args.precision,
        settings={"threads": args.threads, "precision_asked": args.precision, "gen_lr": args.gen_lr,
                  "cls_lr": args.cls_lr, "mpnet": args.mpnet, "pythonpath": args.pythonpath, "epochs": 1,
                  "extra_flags": args.extra},
        notes="peak_host_mb: the trial's own record (result.json); process_max_rss_mb: the whole CLI process "
              "(imports, a first model conversion); one process per trial", out_dir=args.out)
    for row in rows:
        print(" | ".join(f"{key} {row[key]}" for key in COLUMNS if row[key] is not None))
    print(f"written: {path}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
