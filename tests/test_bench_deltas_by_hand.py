"""bench/deltas_by_hand.py on the tiny model: candidates trained over seeds on a run's rows, paired by seed
against a reference; bad input exits with one line and trains nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

BENCH = Path(__file__).resolve().parents[1] / "bench" / "deltas_by_hand.py"


def bench(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_it_trains_each_candidate_per_seed_on_the_rows_of_the_run_it_is_like(make_settings, tmp_path):
    like = tmp_path / "like" / "result.json"
    like.parent.mkdir()
    like.write_text(json.dumps({"settings": make_settings(data_seed=0, epochs=1).to_dict()}))
    against = tmp_path / "against"
    for seed, test in ((1, 0.5), (2, 0.25)):
        (against / f"seed-{seed}").mkdir(parents=True)
        (against / f"seed-{seed}" / "result.json").write_text(json.dumps(
            {"status": "ok", "metric": "accuracy", "dev": {"accuracy": 0.5}, "test": {"accuracy": test}}))
    work = tmp_path / "work"
    done = bench("--like", str(like), "--against", str(against), "--seeds", "2", "--work-dir", str(work),
                 "--candidate", "bitfit=bitfit@1e-2/8")
    assert done.returncode == 0, done.stderr
    results = [json.loads((work / "bitfit" / f"seed-{s}" / "result.json").read_text()) for s in (1, 2)]
    assert [(r["settings"]["seed"], r["settings"]["data_seed"], r["settings"]["batch_size"]) for r in results] == \
        [(1, 0, 8), (2, 0, 8)]
    tests = [100 * r["test"]["accuracy"] for r in results]
    paired = [tests[0] - 50, tests[1] - 25]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| bitfit |"))
    assert f"{', '.join(f'{t:.1f}' for t in tests)} |" in row
    assert row.rstrip(" |").endswith(f"{sum(paired) / 2:.1f} ± {abs(paired[0] - paired[1]) / 2 ** 0.5:.1f}")

    again = bench("--like", str(like), "--against", str(against), "--seeds", "2", "--work-dir", str(work),
                  "--candidate", "bitfit=bitfit@1e-2/8")  # read back, not trained again
    assert again.returncode == 0 and row in again.stdout
    assert [json.loads((work / "bitfit" / f"seed-{s}" / "result.json").read_text()) for s in (1, 2)] == results
    other = bench("--like", str(like), "--seeds", "1", "--work-dir", str(work), "--candidate", "bitfit=bitfit@3e-2/8")
    assert other.returncode != 0 and "another run" in other.stderr


@pytest.mark.slow
def test_a_candidate_may_set_the_heads_pooling(make_settings, tmp_path):
    like = tmp_path / "result.json"
    like.write_text(json.dumps({"settings": make_settings(data_seed=0, epochs=1).to_dict()}))
    done = bench("--like", str(like), "--seeds", "1", "--work-dir", str(tmp_path / "w"),
                 "--candidate", "mean=mean:bitfit@1e-2/8", "--candidate", "cls=bitfit@1e-2/8")
    assert done.returncode == 0, done.stderr
    specs = {name: json.loads((tmp_path / "w" / name / "seed-1" / "result.json").read_text())["settings"]["spec"]
             for name in ("mean", "cls")}
    assert specs["mean"] == {**specs["cls"], "pooling": "mean"}


def test_bad_input_is_one_line_and_trains_nothing(make_settings, tmp_path):
    like = tmp_path / "result.json"
    like.write_text(json.dumps({"settings": make_settings().to_dict()}))  # rows drawn with the training seed
    done = bench("--like", str(like), "--work-dir", str(tmp_path / "w"), "--candidate", "x=lora@1e-3")
    assert done.returncode != 0 and "no data_seed" in done.stderr and not (tmp_path / "w").exists()
    like.write_text(json.dumps({"settings": make_settings(data_seed=0).to_dict()}))
    done = bench("--like", str(like), "--work-dir", str(tmp_path / "w"), "--candidate", "x=nothing@1e-3")
    assert done.returncode != 0 and "neither a preset nor a spec file" in done.stderr
    done = bench("--like", str(like), "--work-dir", str(tmp_path / "w"), "--candidate", "no rate")
    assert done.returncode != 0 and "NAME=[POOLING:]DELTA@LR" in done.stderr and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_epochs_trains_every_candidate_that_long_on_the_same_rows(make_settings, tmp_path):
    like = tmp_path / "result.json"
    like.write_text(json.dumps({"settings": make_settings(data_seed=0, epochs=1).to_dict()}))
    done = bench("--like", str(like), "--seeds", "1", "--epochs", "2", "--work-dir", str(tmp_path / "w"),
                 "--candidate", "b=bitfit@1e-2/8")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "w" / "b" / "seed-1" / "result.json").read_text())
    assert result["settings"]["epochs"] == 2 and result["settings"]["data_seed"] == 0
    assert [entry["epoch"] for entry in result["history"]] == [1, 2]
    assert "· 2 epochs ·" in done.stdout
    bad = bench("--like", str(like), "--epochs", "0", "--work-dir", str(tmp_path / "v"), "--candidate", "b=bitfit@1e-2")
    assert bad.returncode != 0 and "--epochs 0" in bad.stderr and not (tmp_path / "v").exists()
