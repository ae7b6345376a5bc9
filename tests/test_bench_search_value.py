"""bench/search_value.py end to end on the tiny model: three searches, the baselines, re-runs over seeds, one table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

BENCH = Path(__file__).resolve().parents[1] / "bench" / "search_value.py"


def run_bench(command: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
    """The bench in a process group of its own, so that a timeout also ends the searches it started."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_the_search_value_benchmark_runs_end_to_end_on_a_tiny_model(tmp_path, tiny_model_dir, sst2_dir):
    command = [sys.executable, str(BENCH), "--data-dir", str(sst2_dir), "--task", "sst2", "--model",
               str(tiny_model_dir), "--k", "24", "--epochs", "1", "--equivalents", "8", "--seeds", "2",
               "--workers", "1", "--work-dir", str(tmp_path / "work")]
    done = run_bench(command)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for line in ("| autopelt |", "| random |", "| tuned-lora |", "| autopelt pick |", "| tuned-lora pick |",
                 "| baseline unipelt_apl |", "| baseline lora |", "best dev against cumulative training seconds, random"):
        assert line in out, out
    assert "target: autopelt's pick beats tuned LoRA by ≥ 1 point" in out
    assert "one full trial:" in out  # the calibration that sets every strategy's budget
    # the random study starts from study 1's baselines instead of training them again
    import optuna
    storage = f"sqlite:///{tmp_path / 'work' / 'studies.db'}"
    random = optuna.load_study(study_name="value-sst2-random", storage=storage)
    first = optuna.load_study(study_name="value-sst2-autopelt", storage=storage)
    copied = [t.user_attrs["baseline"] for t in random.trials if t.user_attrs.get("baseline")]
    ran = [t.user_attrs["baseline"] for t in first.trials if t.user_attrs.get("baseline") and t.state.name == "COMPLETE"]
    assert copied == ran and "unipelt_apl" in ran
    # a second run reuses the searches and the re-runs: the same table, nothing trained again
    again = run_bench(command)
    assert again.returncode == 0 and "done before, kept" in again.stdout
    assert again.stdout.split("## ")[1] == out.split("## ")[1]

    # --reuse: a new work dir takes the calibration and tuned LoRA (with its re-runs) and runs the rest
    elsewhere = [*command[:-1], str(tmp_path / "work2")]
    reused = run_bench([*elsewhere, "--reuse", str(tmp_path / "work")])
    assert reused.returncode == 0, reused.stderr[-3000:]
    assert "calibration: copied from" in reused.stdout and "tuned-lora: copied from" in reused.stdout
    row = lambda text: next(line for line in text.splitlines() if line.startswith("| tuned-lora pick |"))
    assert row(reused.stdout).split("|")[:7] == row(out).split("|")[:7]  # the paired Δ is to a new pick
    assert "| autopelt pick |" in reused.stdout

    missing = run_bench([*command[:-1], str(tmp_path / "work3"), "--reuse", str(tmp_path / "nothing")])
    assert missing.returncode != 0 and "no finished calibration and tuned-LoRA study there" in missing.stderr
    assert not (tmp_path / "work3").exists()  # nothing written
