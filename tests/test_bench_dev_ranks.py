"""bench/dev_ranks_test.py on a hand-made search-value work dir: the ranks it compares, and a missing table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "dev_ranks_test.py"

# (label, what, study dev, dev per seed 1-5, test per seed 1-5): the study's dev ranks them backwards, the
# re-runs' dev in test order
DELTAS = [("autopelt-pick", "pfeiffer k48", 86.0, [0.80] * 5, [0.70] * 5),
          ("tuned-lora-pick", "lora r8", 85.0, [0.82] * 5, [0.75] * 5),
          ("baseline-unipelt_apl", "unipelt", 84.0, [0.84] * 5, [0.80] * 5)]


def work_dir(root: Path) -> Path:
    work = root / "value-sst2"
    rows = []
    for label, what, study_dev, devs, tests in DELTAS:
        for seed, (dev, test) in enumerate(zip(devs, tests), start=1):
            out = work / "reruns" / label / f"seed-{seed}"
            out.mkdir(parents=True)
            (out / "result.json").write_text(json.dumps({"seed": seed, "metric": "accuracy", "dev_metric": dev,
                                                         "test": {"accuracy": test}}))
        name = label.replace("-pick", " pick").replace("baseline-", "baseline ")
        rows.append(f"| {name} | {what} | 0.001 | 0.5 | {study_dev} | {100 * tests[0]:.1f} ± 0.0 | – |")
    (root / "value-sst2.log").write_text("## sst2 · K=1000 · 3 epochs\n\n" + "\n".join(rows) + "\n")
    return work


def test_it_compares_the_studys_dev_and_the_reruns_dev_with_test(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), str(work_dir(tmp_path))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "| value-sst2 tuned-lora-pick | lora r8 | 0.001 | 85.0 | 82.0 | 82.0 | 75.0 | 75.0 |" in done.stdout
    assert "the study's dev (seed 0) against the test of seeds 3-5 -1.00, the dev of seeds 1-2 against it 1.00" \
        in done.stdout


def test_a_work_dir_without_its_table_is_a_one_line_error(tmp_path):
    work = work_dir(tmp_path)
    (tmp_path / "value-sst2.log").unlink()
    done = subprocess.run([sys.executable, str(BENCH), str(work)], capture_output=True, text=True)
    assert done.returncode != 0 and "no " in done.stderr and len(done.stderr.strip().splitlines()) == 1
