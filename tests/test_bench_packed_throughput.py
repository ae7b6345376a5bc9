"""bench/packed_throughput.py: both modes run the same trials, the packed one as a pack, and the file says so."""

from __future__ import annotations

import json

import pytest
from support import benches
from tinymodels import tiny_model_dir  # noqa: F401  (a fixture)


@pytest.mark.slow  # an end-to-end run of the benchmark (tiny, but 8 trials and their imports)
def test_the_same_trials_alone_and_packed_give_the_same_dev_metrics(tiny_model_dir, glue_dir, tmp_path):
    bench = benches.load_bench("packed_throughput")
    rows = bench.main(["--data-dir", str(glue_dir), "--task", "sst2", "--k", "8", "--dev-size", "16", "--model", str(tiny_model_dir),
                       "--max-length", "32", "--threads", "1", "--batch-size", "4", "--out-dir", str(tmp_path),
                       "--order", "alone,packed,measured"])
    alone, packed, measured = rows
    assert [alone["mode"], packed["mode"], measured["mode"]] == ["alone", "packed", "measured"]
    assert alone["ok"] == packed["ok"] == measured["ok"] == len(bench.MEMBERS)
    assert packed["dev"] == pytest.approx(alone["dev"], abs=1e-4) == measured["dev"]
    assert packed["step_ratio"] is None and measured["step_ratio"] > 0
    assert measured["unpacked"] == (measured["step_ratio"] > 0.9) and not packed["unpacked"]
    assert alone["speedup"] == 1.0 and packed["speedup"] == pytest.approx(
        packed["trials_per_hour"] / alone["trials_per_hour"], abs=1e-3)
    written = json.loads(next(tmp_path.glob("packed_throughput-*.json")).read_text())
    assert [row["mode"] for row in written["rows"]] == ["alone", "packed", "measured"]
    assert "lora r8" in written["settings"]["members"]
