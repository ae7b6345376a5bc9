"""Load a script of bench/ as a module, for tests of its pure functions (bench/ on sys.path, as when it runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # a script imports its neighbours (results, render_docs) as when it runs
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
