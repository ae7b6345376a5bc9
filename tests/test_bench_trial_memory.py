"""bench/trial_memory.py: each trial in its own process, its result.json's peak and the child's own maximum
resident memory read, against the row's target; the results file and the printed table (a stand-in for the CLI)."""

from __future__ import annotations

import json
import sys

from support.benches import load_bench

STAND_IN = """
import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out") + 1])
out.mkdir(parents=True)
if "e2e" in args:
    sys.exit("autopelt: error: a refused input")  # a CLI error: no result.json
held = bytearray(200 * 2**20)  # 200 MiB, touched
json.dump({"status": "ok", "reason": None, "precision": "fp32", "peak_host_memory_mb": 1000.0,
           "peak_host_memory_by": "ru_maxrss", "argv": args}, open(out / "result.json", "w"))
"""


def test_each_trial_is_read_from_its_own_process_against_its_target(tmp_path, capsys):
    bench = load_bench("trial_memory")
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    code = bench.main(["--autopelt", f"{sys.executable} {script}", "--work-dir", str(tmp_path / "work"),
                       "--out", str(tmp_path / "results")])
    assert code == 1  # one row failed
    (written,) = (tmp_path / "results").glob("trial-memory-*.json")
    record = json.loads(written.read_text())
    generation, classification = record["rows"]
    assert classification["status"] == "ok" and classification["peak_host_mb"] == 1000.0
    assert classification["within_target"] is True and classification["target_mb"] == 2.5 * 1024
    assert classification["process_max_rss_mb"] > 200  # the child's own peak, not this process's
    assert generation["status"] == "exit 1" and "a refused input" in generation["reason"]
    assert record["precision"] == "fp32" and record["command"] and record["hardware"]["cpu"]["model"]
    assert "mpnet-base sst2 classification K=500" in capsys.readouterr().out


def test_a_before_run_is_written_beside_this_commits(tmp_path):
    bench = load_bench("trial_memory")
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    bench.main(["--autopelt", f"{sys.executable} {script}", "--only", "classification", "--label", "before",
                "--pythonpath", str(tmp_path), "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "r"),
                "--", "--gradient-checkpointing"])
    (written,) = (tmp_path / "r").glob("trial-memory-before-*.json")
    record = json.loads(written.read_text())
    assert [row["label"] for row in record["rows"]] == ["before"]
    assert record["settings"]["extra_flags"] == ["--gradient-checkpointing"]
    argv = json.loads((tmp_path / "work" / "mpnet-base" / "result.json").read_text())["argv"]
    assert argv[-1] == "--gradient-checkpointing" and argv[argv.index("--model") + 1] == "mpnet-base"
