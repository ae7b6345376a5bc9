"""lab/experiments/: one-off studies kept with their results and conclusion. Each script is only smoke-imported here
(it still imports against today's package, and defines its entry point); what it measured is in its folder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "lab" / "experiments").glob("*/*.py"))


def test_every_experiment_has_a_conclusion_and_bench_stays_small():
    topics = sorted({script.parent for script in SCRIPTS})
    assert topics and all((topic / "README.md").is_file() for topic in topics)
    files = [path for path in (ROOT / "bench").iterdir() if path.is_file()]  # not __pycache__
    assert len(files) <= 12, "bench/ holds the product benchmarks and their tools only"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_the_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"experiment_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None))
