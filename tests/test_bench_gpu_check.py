"""bench/gpu_check.py: its dry mode runs the steps on a CPU and writes the results, the nvidia-smi samples and the log;
the bundles it ships to a device machine are joined, checked and unpacked; nvidia-smi's lines are read."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile

import pytest
from conftest import GLUE_DIR
from support import benches

from autopelt.search.resources import Placement

ROOT = benches.BENCH.parent


def load_bench():
    return benches.load_bench("gpu_check")


def dry(tmp_path, steps: str) -> tuple[dict, str]:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--dry", "--out", str(out), "--steps", steps,
                           "--data-dir", str(GLUE_DIR)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**benches_env(), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = sorted(p.name for p in out.iterdir() if p.is_file())
    profiled = ["profile.txt"] if "trial-profile" in steps else []
    assert written == ["gpu-check-" + written[0][len("gpu-check-"):], "log.txt", *profiled, "smi.csv",
                       "studies.tar.gz"], written
    return json.loads((out / written[0]).read_text()), (out / "log.txt").read_text()


def benches_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_dry_mode_runs_the_qlora_step_and_writes_every_output(tmp_path):
    """The QLoRA step on a CPU: the trial refuses in one line (no CUDA), recorded as the step's status."""
    record, log = dry(tmp_path, "qlora")
    assert record["settings"]["dry"] and record["settings"]["card"] == "no GPU (dry run on the CPU)"
    [row] = record["rows"]
    assert row["step"] == "qlora" and row["status"] == ("exit 2: autopelt: error: --quantize 4bit needs a CUDA GPU "
                                                        "(bitsandbytes' NF4 kernels), and this machine has none")
    assert "$ autopelt train --task sst2 --model" in log and "--quantize 4bit" in log


@pytest.mark.slow
def test_the_dry_mode_runs_every_step_and_counts_the_trials(tmp_path):
    record, _ = dry(tmp_path, ",".join(step[0] for step in load_bench().STEPS))
    rows = {row["step"]: row for row in record["rows"]}
    for name in ("minilm-default", "minilm-workers-1", "minilm-workers-4", "smollm2-default"):
        assert rows[name]["status"] == "ok" and rows[name]["trained"] == 1 and rows[name]["trials_per_hour"] > 0
        assert rows[name]["steady_trials_per_hour"] > rows[name]["trials_per_hour"]
    assert rows["minilm-default"]["workers"] is None  # a CPU's one worker: as before, nothing more said
    assert sorted(rows["trial-profile"]["trials"]) == ["1", "8"]  # one trial profiled at 1 and at 8 CPU threads
    assert all(trial["steps"] > 0 for trial in rows["trial-profile"]["trials"].values())


def test_bundles_are_joined_checked_and_unpacked(tmp_path):
    bench = load_bench()
    staged = tmp_path / "stage"
    (staged / "parts").mkdir(parents=True)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        payload = b"{}"
        info = tarfile.TarInfo("minilm/config.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    whole = archive.getvalue()
    (staged / "parts" / "minilm.tgz.00").write_bytes(whole[:100])
    (staged / "parts" / "minilm.tgz.01").write_bytes(whole[100:])
    (staged / "parts" / "minilm.sha256").write_text(hashlib.sha256(whole).hexdigest() + "  minilm.tgz\n")
    assert (bench.unpack(staged, "minilm") / "config.json").read_text() == "{}"
    (staged / "parts" / "minilm.sha256").write_text("0" * 64)
    with pytest.raises(SystemExit, match="its sha256 is not the one carried"):
        bench.unpack(staged, "minilm")
    with pytest.raises(SystemExit, match="no wheels parts"):
        bench.unpack(staged, "wheels")


def test_nvidia_smi_lines_steps_and_the_workers_line_are_read():
    bench = load_bench()
    assert bench.parse_smi("87, 10321") == (87.0, 10321.0) and bench.parse_smi("[N/A], 10") is None
    assert [step[0] for step in bench.chosen("qlora,minilm-default")] == ["minilm-default", "qlora"]
    with pytest.raises(SystemExit, match="unknown step"):
        bench.chosen("minilm-8")
    said = Placement(15, 1, 1 / 15, "15 workers on 16 CPU cores, 1 GPU (NVIDIA H200, 139 of 140 GiB free): … "
                                    "(--workers to choose)").note
    assert bench.workers_line(f"study x\n{said}\n trial  delta") == said
    command = bench.step_command("minilm-workers-4", "m", ["--workers", "4"], "d", ROOT / "w", 60, dry=False)
    assert command[:2] == ["search", "--task"] and command[command.index("--budget") + 1] == "60s"
