"""The installed wheel holds the product alone: `autopelt` and its data files, never the lab (lab/) or the
repository's tests, benchmarks and docs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_holds_autopelt_and_its_data_only(tmp_path):
    source = tmp_path / "source"  # a copy of the checkout's tree: the build writes its own folders beside it
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build",
                                                                  "benchmarks", "*.db"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("autopelt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"autopelt"}, sorted(tops)
    assert "autopelt/portfolio/data/portfolio-all-MiniLM-L6-v2.json" in names  # what the portfolio loader reads
    assert any(name.startswith("autopelt/search_spaces/") for name in names)
    assert not any("metalearning" in name or "experiments" in name for name in names)
