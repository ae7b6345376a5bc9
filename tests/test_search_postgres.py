"""Several search processes sharing one study in a real PostgreSQL server end with exactly the budget.

Needs AUTOPELT_TEST_POSTGRES_URL (start a server with `eval "$(bash .ci/postgres.sh)"`); skipped without it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections import Counter

import optuna
import pytest
from conftest import GLUE_DIR
from optuna.trial import TrialState

from autopelt.delta.presets import BASELINES

URL = os.environ.get("AUTOPELT_TEST_POSTGRES_URL")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not URL, reason="AUTOPELT_TEST_POSTGRES_URL is not set (bash .ci/postgres.sh)")]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def start(tmp_path, name: str, index: int, options: dict, **extra) -> subprocess.Popen:
    """A search process on the stand-in trial of tests/support/fakes.py."""
    arguments = {"options": {"task": "rte", "storage": URL, "study_name": name, "out": str(tmp_path / "out"),
                             "data_dir": str(GLUE_DIR), **options}, **extra}
    log = open(tmp_path / f"search-{index}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "support.fakes", json.dumps(arguments)],
                            stdout=log, stderr=subprocess.STDOUT)


def finish(processes, tmp_path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    for index, process in enumerate(processes):
        try:
            code = process.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert code == 0, (tmp_path / f"search-{index}.log").read_text()[-3000:]


def trials_of(name: str):
    return optuna.load_study(study_name=name, storage=URL).get_trials(deepcopy=False)


@pytest.fixture(scope="module")
def ray_address():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_two_searches_through_ray_share_a_study_and_stop_at_the_budget(tmp_path, ray_address):
    name = f"concurrent-{uuid.uuid4().hex[:8]}"
    options = {"budget": 6, "workers": 1, "cpus_per_trial": 1, "ray_address": ray_address,
               "early_stopping": False}
    processes = [start(tmp_path, name, i, options, seconds_per_epoch=0.3) for i in range(2)]
    finish(processes, tmp_path)

    trials = trials_of(name)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 6 and not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.PRUNED)]
    assert len({t.number for t in complete}) == 6
    assert len({t.user_attrs["controller"]["pid"] for t in complete}) == 2  # both processes trained
    baselines = Counter(t.user_attrs.get("baseline") for t in complete if "baseline" in t.user_attrs)
    assert baselines == {name: 1 for name in BASELINES[:3]}  # half the budget, each once, though two processes ran


@pytest.mark.parametrize("budget", [1, 12])
def test_four_searches_racing_for_the_last_claims_never_overshoot(tmp_path, budget):
    """No Ray and instant trials, all four starting to ask at the same moment: they contend on every ask."""
    name = f"race-{budget}-{uuid.uuid4().hex[:8]}"
    start_at = time.time() + 15  # after every process has imported and opened the study (late ones just start late)
    processes = [start(tmp_path, name, i, {"budget": budget, "baselines": False}, serial=True, start_at=start_at)
                 for i in range(4)]
    finish(processes, tmp_path)

    trials = trials_of(name)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == budget
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    refused = [t for t in trials if t.user_attrs.get("fail_reason") == "budget reached"]
    print(f"budget {budget}: {len(trials)} trials, {len(refused)} refused by the claim rule")
