"""The lab's tests: the meta-dataset's pipeline (lab/metalearning) and the experiments' smoke imports. They run in
their own CI step (`python -m pytest lab/tests`), never in the product's suite, with the product's test set-up
(tests/conftest.py: isolated caches, no hub, the tiny models) and its helpers importable."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAB, TESTS = ROOT / "lab", ROOT / "tests"
sys.path[:0] = [str(LAB), str(TESTS)]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LAB), os.environ.get("PYTHONPATH")]))  # subprocesses

_spec = importlib.util.spec_from_file_location("autopelt_tests_conftest", TESTS / "conftest.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
globals().update({name: value for name, value in vars(_shared).items() if not name.startswith("__")})
