"""Searches through Ray Tune on SQLite, on the synthetic objective: end to end, failures, ASHA, parameter
budget, wall-time budget, and resuming after the search process is killed with SIGKILL.

One local Ray (2 CPUs) serves the whole module; its workers run the stand-in trial of tests/support/fakes.py
in place of `autopelt.train.run_trial` (fakes.RUNTIME_ENV). A killed search runs in a subprocess that joins it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import GLUE_DIR
from optuna.trial import TrialState
from support import fakes

from autopelt.delta.presets import BASELINES
from autopelt.search import claims
from autopelt.search.run import SearchOptions, run_search
from autopelt.study.record import read_all

ray = pytest.importorskip("ray")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def ray_address():
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, runtime_env=fakes.RUNTIME_ENV)
    print(f"ray.init: {time.monotonic() - started:.1f}s")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def options(tmp_path: Path, **changes) -> SearchOptions:
    base = {"task": "rte", "storage": f"sqlite:///{tmp_path}/study.db", "out": str(tmp_path / "out"),
            "cpus_per_trial": 1, "space": str(fakes.SPACE), "data_dir": str(GLUE_DIR), "baselines": False,
            "finalists": 0}
    return SearchOptions(**{**base, **changes})


def search(tmp_path, seconds_per_epoch: float = 0.0, trials: dict | None = None, **changes):
    fakes.script(tmp_path / "out", seconds_per_epoch, trials)
    lines: list[str] = []
    outcome = run_search(options(tmp_path, **changes), echo=lines.append)
    return outcome, lines


def calls(tmp_path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("trial-*/fake_call.json"))]


def by_state(study, *states):
    return [t for t in study.get_trials(deepcopy=False) if t.state in states]


@pytest.mark.slow
def test_a_search_end_to_end_records_failures_and_goes_on(tmp_path, ray_address):
    # a budget of 8 runs four baselines (at most half of it), trials 0-3; the first two searched trials fail
    outcome, lines = search(tmp_path, trials={4: {"mode": "nan"}, 5: {"mode": "raise"}}, baselines=True, budget=8,
                            workers=2)
    study = outcome.study

    trained = by_state(study, TrialState.COMPLETE, TrialState.PRUNED)
    assert len(trained) == 8 and outcome.recorded == 8
    assert {t.user_attrs.get("baseline") for t in trained} == set(BASELINES[:4]) | {None}
    failed = {t.number: t.user_attrs["fail_reason"] for t in by_state(study, TrialState.FAIL)}
    assert failed == {4: "dev metric is nan (not a finite number)", 5: "RuntimeError: the fake trial exploded"}
    assert not by_state(study, TrialState.RUNNING, TrialState.WAITING)

    assert len(calls(tmp_path)) == 10  # every trial that trained or failed ran once; nothing else ran
    assert all(call["device"] == "cpu" and call["threads"] == 1 for call in calls(tmp_path))
    finished = by_state(study, TrialState.COMPLETE, TrialState.FAIL)  # early-stopped trials are cut short
    assert len(finished) == 10 - len(by_state(study, TrialState.PRUNED))  # how many ASHA stops varies by draw
    for trial in finished:
        assert (Path(trial.user_attrs["result_dir"]) / "result.json").is_file()

    assert outcome.best.state == TrialState.COMPLETE
    assert outcome.best.values[0] == max(t.value for t in by_state(study, TrialState.COMPLETE))
    trial_lines = [line for line in lines if line.lstrip().startswith("#") and "… epoch" not in line]
    assert len(trial_lines) == 10  # one per trained or failed trial
    assert any("… epoch 1/" in line for line in lines)  # and running trials show their epochs
    assert any(line.startswith("best: #") for line in lines)
    assert any(f"autopelt export --study {outcome.plan.study_name}" in line for line in lines)


@pytest.mark.slow
def test_a_trial_gets_the_cpus_ray_gives_it_as_threads(tmp_path, ray_address, capsys):
    run_search(options(tmp_path, budget=1, cpus_per_trial=2))  # echo: print
    [call] = calls(tmp_path)
    assert call["threads"] == 2 and call["omp"] == "2" and call["device"] == "cpu"
    assert "best: #0" in capsys.readouterr().out


@pytest.mark.slow
def test_asha_stops_a_bad_trial_early_and_best_ignores_it(tmp_path, ray_address):
    qualities = {0: {"quality": 0.8}, 1: {"quality": 0.9}, 2: {"quality": 0.05}, 3: {"quality": 0.95}}
    outcome, lines = search(tmp_path, 0.15, qualities, epochs=9, budget=4, workers=1)
    study = outcome.study

    [pruned] = by_state(study, TrialState.PRUNED)
    assert pruned.number == 2  # the bad one
    assert pruned.user_attrs["stopped_by"] == "early stopping" and pruned.user_attrs["full_fidelity"] is False
    assert 1 <= pruned.user_attrs["fidelity"] < 9 and pruned.intermediate_values
    assert len(by_state(study, TrialState.COMPLETE)) == 3
    assert outcome.best.number == 3 and outcome.best.fidelity == 9
    assert any("stopped " in line and f"#{pruned.number}" in line for line in lines)


@pytest.mark.slow
def test_finalists_train_the_best_trial_again_on_a_ray_worker_with_their_own_seed(tmp_path, ray_address):
    qualities = {0: {"quality": 0.7}, 1: {"quality": 0.9}, 2: {"quality": 0.6}, 3: {"quality": 0.88}}
    outcome, lines = search(tmp_path, 0.0, qualities, budget=4, workers=1, finalists=1, early_stopping=False)
    records = read_all(outcome.study)
    assert [r.finalist_of for r in records] == [{}, {}, {}, {"trial": 1, "seed": 1000}]
    assert [call["seed"] for call in calls(tmp_path)] == [0, 0, 0, 1000]
    assert outcome.best.number == 1  # the answer is the trial the finalist trains again, never its re-run
    assert any("finalist" in line for line in lines)


def test_the_answer_has_one_dev_value_in_the_console_the_report_the_dashboard_and_the_api(tmp_path, ray_address):
    """The best trial trained again scores 0.88 then 0.80: 0.84, "mean of 2 seeds", wherever it is read."""
    import dataclasses
    import re

    import autopelt
    from autopelt.dashboard import best_line
    from autopelt.report.contents import collect

    fakes.script(tmp_path / "out", 0.0, {0: {"quality": 0.7}, 1: {"quality": 0.88}, 2: {"quality": 0.6},
                                         3: {"quality": 0.8}})
    lines: list[str] = []
    given = dataclasses.asdict(options(tmp_path, budget=4, workers=1, finalists=1, early_stopping=False))
    outcome = autopelt.search_delta(given.pop("task"), echo=lines.append, **{**given, "budget": 4})

    console = next(line for line in lines if line.startswith("best: "))
    shown = re.search(r"dev accuracy (\d\.\d{4}) \(mean of 2 seeds: 0\.8800, 0\.8000\)", console)
    assert shown, console
    attribute = outcome.study.user_attrs["answer"]
    report = collect(outcome.study).header.best
    assert attribute["trial"] == outcome.best.number == report.number == 1
    assert float(shown[1]) == pytest.approx(0.84, abs=1e-9)
    assert outcome.best.dev_value == attribute["dev"] == report.dev == pytest.approx(0.84)
    assert attribute["dev_of"] == outcome.best.dev_of == report.dev_of == "mean of 2 seeds"
    assert "dev accuracy 0.8400, mean of 2 seeds" in best_line(outcome.study)


@pytest.mark.slow
def test_over_budget_samples_never_train(tmp_path, ray_address):
    outcome, _ = search(tmp_path, budget=4, workers=2, max_params="40k")  # LoRA r on MiniLM: 9,216 r + 770
    ranks = [call["spec"]["methods"][0]["rank"] for call in calls(tmp_path)]
    assert len(ranks) == 4 and max(ranks) <= 4
    refused = by_state(outcome.study, TrialState.FAIL)
    assert len(refused) == outcome.rejected
    assert all(t.user_attrs["fail_reason"].startswith("over parameter budget") for t in refused)


@pytest.mark.slow
def test_a_time_budget_ends_the_search_cleanly(tmp_path, ray_address):
    started = time.monotonic()
    # 20 s: Ray's workers need a few seconds to start on a loaded 2-core machine before any trial can finish
    # trials 0 and 1 take a second; 2 and 3 take half a minute, so the deadline falls while they run
    slow = {"seconds_per_epoch": 10}
    outcome, _ = search(tmp_path, 0.3, {2: slow, 3: slow}, budget="20s", workers=2, early_stopping=False)
    assert time.monotonic() - started < 60
    study = outcome.study
    assert not by_state(study, TrialState.RUNNING)
    assert {t.number for t in by_state(study, TrialState.COMPLETE)} == {0, 1}
    stopped, interrupted = by_state(study, TrialState.PRUNED), by_state(study, TrialState.FAIL)
    assert {t.number for t in stopped + interrupted} == {2, 3}  # cut short by the deadline
    for trial in stopped:  # evaluated at least once: recorded where it stood
        assert trial.user_attrs["stopped_by"] == "time budget" and trial.user_attrs["fidelity"] >= 1
    for trial in interrupted:  # started but never evaluated: queued again
        assert trial.user_attrs["fail_reason"] == claims.INTERRUPTED
        assert any(t.user_attrs.get("retry_of") == trial.number for t in study.trials)


@pytest.mark.slow
def test_a_search_killed_with_sigkill_resumes_without_losing_a_trial(tmp_path, ray_address):
    opts = {"task": "rte", "storage": f"sqlite:///{tmp_path}/study.db", "out": str(tmp_path / "out"),
            "budget": 7, "workers": 2, "cpus_per_trial": 1, "ray_address": ray_address, "data_dir": str(GLUE_DIR)}
    arguments = {"options": opts, "seconds_per_epoch": 0.4}
    process = subprocess.Popen([sys.executable, "-m", "support.fakes", json.dumps(arguments)],
                               stdout=subprocess.DEVNULL, stderr=open(tmp_path / "search.log", "w"))
    try:
        _wait_for(lambda: _complete_trials(tmp_path / "study.db") >= 2, timeout=300)  # a bound for a loaded machine
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    study = _study(tmp_path)
    before = {t.number: t.value for t in by_state(study, TrialState.COMPLETE)}
    left_running = {t.number for t in by_state(study, TrialState.RUNNING)}
    assert left_running, "the kill should catch trials mid-flight"

    outcome, lines = search(tmp_path, 0.05, baselines=True, budget=7, workers=2)
    study = outcome.study
    after = {t.number: t.value for t in by_state(study, TrialState.COMPLETE)}
    assert before.items() <= after.items()  # no completed trial lost or changed
    assert len(by_state(study, TrialState.COMPLETE, TrialState.PRUNED)) == 7  # the budget, exactly
    assert not by_state(study, TrialState.RUNNING, TrialState.WAITING)
    for number in left_running:
        interrupted = study.trials[number]
        assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["fail_reason"] == claims.INTERRUPTED
        [retry] = [t for t in study.trials if t.user_attrs.get("retry_of") == number]
        # the same parameters again (none, if the kill came between ask and drawing the delta)
        assert retry.system_attrs["fixed_params"] == interrupted.params
        assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert any(line.startswith("resuming:") for line in lines)
    baselines = [t.user_attrs["baseline"] for t in by_state(study, TrialState.COMPLETE) if "baseline" in t.user_attrs]
    assert sorted(baselines) == sorted(BASELINES[:3])  # each once (at most half of 7), though the search ran twice


def _study(tmp_path):
    storage = f"sqlite:///{tmp_path}/study.db"
    [name] = optuna.get_all_study_names(storage)
    return optuna.load_study(study_name=name, storage=storage)


def _complete_trials(path: Path) -> int:
    """Read-only, so that watching the database never races the search creating it."""
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        return connection.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]


def _wait_for(condition, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except sqlite3.Error:  # the search is creating the database
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_the_searcher_pickles_without_its_controller(tmp_path):
    """Tune pickles its config (tuner.pkl); an open study or the terminal must not have to go in there."""
    import pickle

    from autopelt.search.ray_backend import ControllerSearcher

    searcher = ControllerSearcher(controller=lambda: None, max_concurrent=3)  # a lambda does not pickle
    copy = pickle.loads(pickle.dumps(searcher))
    assert copy.controller is None and copy.max_concurrent == 3 and copy.metric == "dev_metric"


def test_the_finalists_stopper_stops_what_the_controller_says_never_a_final_result_and_pickles_empty():
    import pickle
    import types

    from autopelt.search.ray_backend import EVENT_KEY, RESULT_KEY, ControllerSearcher, FinalistsStopper

    asked = []
    controller = types.SimpleNamespace(superseded=lambda number: asked.append(number) or number == 7)
    searcher = ControllerSearcher(controller=controller, max_concurrent=2)
    searcher.numbers = {"a": [7], "b": [8], "pack": [9, 10]}
    stopper = FinalistsStopper(searcher)
    assert stopper("a", {EVENT_KEY: "{}"}) and not stopper("b", {EVENT_KEY: "{}"})
    assert not stopper("a", {RESULT_KEY: "{}"}) and not stopper("unknown", {EVENT_KEY: "{}"})
    assert not stopper("pack", {EVENT_KEY: "{}"})  # a pack holds finalists: never stopped for them
    assert asked == [7, 8] and not stopper.stop_all()
    assert pickle.loads(pickle.dumps(stopper)).searcher is None


def test_a_trial_tune_failed_without_telling_the_searcher_is_told_at_the_next_step():
    """Tune 2.60 fails a trial whose reused worker could not be reset without calling the searcher; the controller
    would wait for it for ever (seen: a qnli search waited 30 minutes with an idle worker)."""
    import pickle
    import types

    from autopelt.search.ray_backend import ControllerSearcher, UnreportedErrors

    crashed = []
    controller = types.SimpleNamespace(interrupt=crashed.append)
    searcher = ControllerSearcher(controller=controller, max_concurrent=2)
    searcher.numbers = {"a": [7], "b": [8]}
    trial = lambda trial_id, status: types.SimpleNamespace(trial_id=trial_id, status=status, ERROR="ERROR")  # noqa: E731
    callback = UnreportedErrors(searcher)
    callback.on_step_end(1, [trial("a", "ERROR"), trial("b", "RUNNING"), trial("c", "ERROR")])
    callback.on_step_end(2, [trial("a", "ERROR"), trial("b", "RUNNING")])
    assert crashed == [7] and searcher.numbers == {"b": [8]}  # queued again once; a trial it never held is not its own
    assert pickle.loads(pickle.dumps(callback)).searcher is None


@pytest.mark.slow
def test_a_local_ray_starts_without_the_token_notice(tmp_path):
    """A search that starts its own Ray keeps Ray's token authentication but not its notice at every start, and
    hands its workers the CPU's bf16 speedup it measured."""
    import tempfile

    script = ("import os, types, ray; from autopelt.search.ray_backend import ray_session\n"
              "options = types.SimpleNamespace(ray_address=None, precision='auto')\n"
              "with ray_session(types.SimpleNamespace(options=options)):\n"
              "    print('auth mode', os.environ.get('RAY_AUTH_MODE'))\n"
              "    worker = ray.get(ray.remote(lambda: os.environ.get('AUTOPELT_CPU_BF16_SPEEDUP')).remote())\n"
              "    print('bf16 speedup', os.environ.get('AUTOPELT_CPU_BF16_SPEEDUP'), worker)\n"
              "    print('thread timeout', ray.get(ray.remote(lambda: os.environ.get("
              "'TUNE_FUNCTION_THREAD_TIMEOUT_S')).remote()))\n")
    short = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = {**os.environ, "RAY_TMPDIR": short, "HOME": str(tmp_path)}
    env.pop("RAY_AUTH_MODE", None)
    env.pop("AUTOPELT_CPU_BF16_SPEEDUP", None)  # measured here, once, and handed to the workers
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "auth mode token" in done.stdout  # Ray turned token authentication on
    driver, worker = done.stdout.split("bf16 speedup ")[1].split("\n")[0].split()
    assert "thread timeout 60" in done.stdout  # a reused worker waits for its last trial's thread
    assert driver == worker and (driver == "none" or float(driver) > 0)
    assert "Token authentication" not in done.stderr


def test_ctrl_c_drops_tunes_restore_hint_and_no_other_warning():
    from autopelt.search import ray_backend

    ray_backend._tune_environment()
    tune_log = logging.getLogger("ray.tune.tune")  # Ray's loggers do not propagate: a handler of its own listens
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    tune_log.addHandler(handler)
    try:
        tune_log.warning("Experiment has been interrupted, but the most recent state was saved.\n"
                         'Resume experiment with: Tuner.restore(path="/x", trainable=...)')
        tune_log.warning("another warning")
    finally:
        tune_log.removeHandler(handler)
    assert seen == ["another warning"]


def test_tune_keeps_as_many_trials_pending_as_there_are_workers(monkeypatch):
    """Ray's own count of pending trials for a searcher like autopelt's: one without `pending_trials` (each trial's
    worker waits for the last one's to start), the workers' count with it, the user's value where they set one."""
    from ray.tune.execution.tune_controller import _get_max_pending_trials
    from ray.tune.search import SearchGenerator, Searcher

    from autopelt.search.ray_backend import PENDING_TRIALS, pending_trials

    monkeypatch.delenv(PENDING_TRIALS, raising=False)
    generator = SearchGenerator(Searcher())
    assert _get_max_pending_trials(generator) == 1
    with pending_trials(15):
        assert _get_max_pending_trials(generator) == 15
    assert PENDING_TRIALS not in os.environ
    monkeypatch.setenv(PENDING_TRIALS, "3")
    with pending_trials(15):
        assert _get_max_pending_trials(generator) == 3
    assert os.environ[PENDING_TRIALS] == "3"
