"""Honest dependencies: ranges in the package's metadata (your torch stays), exact versions in constraints.txt,
which the README's one install command and CI use."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OTHER_TORCHES = ("2.6.0", "2.9.1", "2.12.0", "2.13.0", "2.14.1", "2.15.0")  # GPU setups, older and newer


@pytest.fixture(scope="module")
def requirements(tmp_path_factory) -> list[Requirement]:
    """Requires-Dist of the package as pip sees it: the metadata setuptools builds from pyproject.toml (in a
    copy, so the checkout gains no egg-info)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    (source / "autopelt").mkdir()
    (source / "autopelt" / "__init__.py").write_text("")
    out = tmp_path_factory.mktemp("metadata")
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    metadata = (out / done.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    return [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
            if line.startswith("Requires-Dist:")]


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    exact = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in exact)
    return {canonicalize_name(r.name): next(iter(r.specifier)).version for r in exact}


def test_torch_is_a_range_so_an_installed_torch_stays(requirements):
    torch = [r for r in requirements if r.name == "torch"]
    assert len(torch) == 1 and torch[0].marker is None
    admitted = [v for v in OTHER_TORCHES if torch[0].specifier.contains(v)]
    assert admitted == list(OTHER_TORCHES), f"torch{torch[0].specifier} would replace an installed torch"
    assert not torch[0].specifier.contains("3.0.0")  # a major release is not assumed to work


def test_no_requirement_is_an_exact_pin(requirements):
    exact = [str(r) for r in requirements if any(s.operator in ("==", "===") for s in r.specifier)]
    assert exact == []


def test_constraints_pin_the_known_good_versions_inside_the_ranges(requirements):
    pinned = pins()
    assert pinned["torch"] == "2.13.0"  # the CPU wheel on this project's machines
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name in pinned:
            assert requirement.specifier.contains(pinned[name]), f"constraints.txt {name}=={pinned[name]} is " \
                                                                  f"outside pyproject's {requirement}"
    named = {canonicalize_name(r.name) for r in requirements if r.name != "autopelt"}
    assert named <= set(pinned), f"not pinned: {sorted(named - set(pinned))}"


def test_the_readme_install_command_is_the_one_ci_runs():
    readme = (ROOT / "README.md").read_text()
    install = re.search(r"## Install\n\n```bash\n(.+?)\n```", readme).group(1)
    assert "-c constraints.txt" in install and '".[dev]"' in install
    ci = (ROOT / ".ci" / "run").read_text()
    assert install.replace("pip install ", "pip install -q ") in ci
