"""bench/checkpointing.py on a tiny random Llama: both settings measured in their own processes, the same loss,
and a results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from generationdata import make_tiny_lm_folder

BENCH = Path(__file__).resolve().parents[1] / "bench" / "checkpointing.py"


@pytest.mark.slow
def test_the_bench_measures_both_settings_with_the_same_loss(tmp_path):
    model = make_tiny_lm_folder(tmp_path / "lm")
    out = subprocess.run([sys.executable, str(BENCH), "--model", str(model), "--steps", "1", "--seq", "16",
                          "--batch", "2", "--threads", "1", "--results-dir", str(tmp_path / "results")],
                         capture_output=True, text=True, check=True)
    assert "same loss: True" in out.stdout
    [written] = (tmp_path / "results").glob("checkpointing-lm-*.json")
    rows = json.loads(written.read_text())["rows"]
    assert [r["checkpointing"] for r in rows] == [False, True] and all(r["step_s"] > 0 for r in rows)
