"""Where every bench script writes what it measured, so that the docs' tables can be rendered again from files.

    from results import write_results          # bench/ is on sys.path when a bench script runs
    write_results(name, rows, columns=None, precision=None, settings=None, notes=None, out_dir=None) -> Path

- `name`: the benchmark's name, a slug (`search-value-sst2`); the file is
  `benchmarks/results/<name>-<YYYY-MM-DD>.json` (a second run on the same day replaces it).
- `rows`: the table, a list of dicts (JSON values); `columns`: the keys to show and their order (default: the
  first row's keys). Numbers are stored as measured; rendering rounds them.
- `precision`: `fp32`, `bf16`, … as the runs computed (None where it does not apply); `settings`: anything else
  that decides the figures (task, K, epochs, seeds, model); `notes`: one line shown under the table.
- `out_dir`: another folder than `benchmarks/results/` (tests).

Every file also records the command line, the commit (with `+dirty` when the work tree had changes), the date
(UTC), the hardware (CPU model, core count and the vector-instruction flags that decide speed and precision, or
the GPU's name) and the torch version. `python bench/render_docs.py` turns the newest file of each name into the
table between `<!-- results: NAME -->` and `<!-- /results -->` in README.md and docs/*.md.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# The CPU flags that decide how fast a step is and whether bf16 is native.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def write_results(name: str, rows: list[dict], columns: list[str] | None = None, precision: str | None = None,
                  settings: dict | None = None, notes: str | None = None, out_dir: str | Path | None = None) -> Path:
    """Write one benchmark's results as JSON (module docstring); returns the file written."""
    if not NAME.match(name):
        raise ValueError(f"benchmark name {name!r}: use lower-case letters, digits, '.', '_' and '-'")
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "name": name, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "command": " ".join(sys.argv),
        "commit": commit(), "hardware": hardware(), "torch": torch_version(), "precision": precision,
        "settings": settings or {}, "columns": list(columns or (rows[0].keys() if rows else ())),
        "rows": rows, "notes": notes,
    }
    folder = Path(out_dir) if out_dir else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{now:%Y-%m-%d}.json"
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(staging, path)
    return path


def commit() -> str:
    """$BENCH_COMMIT where set (a copy sent to a GPU machine: its .git, where one travels, need not be the tree's);
    else the checked-out commit, `+dirty` when tracked files other than benchmarks/results/ (what benches write, a
    script's own earlier files among them) differ from it; `unknown` outside a git checkout."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results")
        return head + ("+dirty" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hardware() -> dict:
    """The CPU (model, cores, speed-relevant flags) and the GPU's name, if torch sees one."""
    cpu = {"model": platform.processor() or platform.machine(), "cores": os.cpu_count(), "flags": []}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            cpu["model"] = value.strip()
        elif key.strip() == "flags":
            present = set(value.split())
            cpu["flags"] = [flag for flag in SPEED_FLAGS if flag in present]
            break
    return {"cpu": cpu, "gpu": gpu_name()}


def gpu_name() -> str | None:
    if "torch" not in sys.modules:  # never import torch only to find there is no GPU
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def torch_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001 - any failure means: not installed here
        return None
