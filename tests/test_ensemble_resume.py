"""A search killed with SIGKILL mid-study, then run again with the same command, ends with the ensemble an
uninterrupted run of that command ends with: the same members (by configuration), weights and dev metric.

The study is the UniPELT(APL) baseline, a three-member portfolio and sampled trials on a tiny model, trials run
one at a time in the search's own process (tests/support/serial_cli.py) and train for real, so every planned
trial's predictions depend only on its configuration and seed. The sampler's draws differ between any two runs
of a command (its seed is mixed with the process id, so that processes sharing a study draw apart), so the
ensembles compared are those of the planned trials (the baseline and the portfolio's members; a retry is queued as
what it replaces): what the same command trains in every run."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from tinymodels import NEGATIVE, POSITIVE, sentence, tiny_model_dir  # noqa: F401  (a fixture)

from autopelt.cli import main
from autopelt.ensemble.study import study_ensemble
from autopelt.study.record import trial_dirs
from autopelt.portfolio.portfolio import to_file
from support.configs import BY_NAME

MEMBERS = ("lora-r8-qv@3e-3", "pfeiffer-48@3e-3", "lora-r8-qv-b16@2e-3")


def _noisy_rows(folder, rows: dict[str, int]) -> None:
    """Rows that say their label through "good"/"bad", a quarter of them with the other label: trials learn, and
    their dev predictions differ enough for the ensemble to weigh them."""
    import json

    rng = random.Random(0)
    folder.mkdir(parents=True)
    for split, count in rows.items():
        lines = []
        for _ in range(count):
            label = rng.random() < 0.5
            said = label if rng.random() < 0.75 else not label
            lines.append(json.dumps({"text": sentence(rng, POSITIVE if said else NEGATIVE), "label": str(label)}))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


def _command(tmp_path, model_dir, name: str) -> list[str]:
    return ["search", "--train-file", str(tmp_path / "data/train.jsonl"), "--validation-file",
            str(tmp_path / "data/validation.jsonl"), "--model", str(model_dir), "--portfolio",
            str(tmp_path / "portfolio.json"), "--budget", "8", "--epochs", "2", "--finalists", "0",
            "--study-name", name, "--storage", f"sqlite:///{tmp_path}/{name}.db", "--out", str(tmp_path / name)]


def _count(path, state: str, training: bool = False) -> int:
    """Trials in `state`; with `training`, only those past the controller's checks (a trial asked and failed at
    once, as over budget, is RUNNING for a moment and never trains)."""
    if not path.exists():
        return 0
    query = "SELECT count(*) FROM trials WHERE state = ?"
    if training:
        query += (" AND trial_id IN (SELECT trial_id FROM trial_user_attributes WHERE key = 'result_dir')")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
            return connection.execute(query, (state,)).fetchone()[0]
    except sqlite3.Error:  # the search is creating the database
        return 0


def _ensemble(tmp_path, name: str):
    from autopelt.study.record import read_all

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/{name}.db")
    planned = {str(Path(r.result_dir)) for r in read_all(study) if r.result_dir and (r.baseline or r.portfolio)}
    chosen = study_ensemble([d for d in trial_dirs(study) if str(d) in planned])
    members = [(m.result["settings"]["spec"], m.result["settings"]["learning_rate"]) for m in chosen.members]
    return study, chosen, members


@pytest.mark.slow
def test_a_search_killed_mid_study_ends_with_the_uninterrupted_runs_ensemble(tiny_model_dir, tmp_path,  # noqa: F811
                                                                              monkeypatch, capsys):
    from support import serial_cli

    from autopelt.models import model_name

    _noisy_rows(tmp_path / "data", {"train": 300, "validation": 200})
    to_file([BY_NAME[m] for m in MEMBERS], model_name(str(tiny_model_dir)), {"tasks": ["a"]},
            tmp_path / "portfolio.json", {"unipelt_apl": 1e-3})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path.parent), *sys.path])}
    killed = subprocess.Popen([sys.executable, "-m", "support.serial_cli", *_command(tmp_path, tiny_model_dir,
                                                                                     "killed")],
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "w"),
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 600  # a bound for a loaded 2-core machine
        db = tmp_path / "killed.db"  # two trials done and the next one training: the kill lands mid-trial
        while (_count(db, "COMPLETE") < 2 or _count(db, "RUNNING", training=True) < 1) and killed.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert killed.returncode == -signal.SIGKILL, (tmp_path / "log").read_text()[-2000:]
    assert _count(db, "RUNNING", training=True) == 1, "the kill landed between trials"
    study = optuna.load_study(study_name="killed", storage=f"sqlite:///{tmp_path}/killed.db")
    assert 2 <= sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) < 8

    serial_cli.serial(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(_command(tmp_path, tiny_model_dir, "killed")) == 0  # the same command: it resumes
    assert "resuming" in capsys.readouterr().out
    assert main(_command(tmp_path, tiny_model_dir, "whole")) == 0
    capsys.readouterr()

    resumed, after_kill, members = _ensemble(tmp_path, "killed")
    whole, uninterrupted, members_whole = _ensemble(tmp_path, "whole")
    assert len(uninterrupted.members) >= 2  # else the comparison says little
    assert members == members_whole
    assert after_kill.weights == uninterrupted.weights
    assert after_kill.dev == uninterrupted.dev and after_kill.single_dev == uninterrupted.single_dev
    assert after_kill.single.result["settings"]["spec"] == uninterrupted.single.result["settings"]["spec"]
    assert len(resumed.trials) > len(whole.trials)  # the kill did cut a trial short, and it ran again


def test_a_trial_the_study_failed_is_no_candidate_though_its_folder_holds_a_finished_result(tmp_path):
    """The kill's worst moment: the trial wrote result.json, the study never recorded it, and its retry trains the
    same configuration again; the ensemble takes the retry alone."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", direction="maximize")
    for number, state in enumerate((TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE, TrialState.PRUNED)):
        folder = tmp_path / f"trial-{number}"
        folder.mkdir()
        (folder / "result.json").write_text('{"status": "ok", "dev_metric": 0.5}')
        study.add_trial(create_trial(state=state, value=0.5 if state == TrialState.COMPLETE else None,
                                     params={"x": 0.1}, distributions={"x": FloatDistribution(0, 1)},
                                     user_attrs={"result_dir": str(folder)}))
    assert [p.name for p in trial_dirs(study)] == ["trial-0", "trial-2", "trial-3"]
