"""Each private Optuna attribute autopelt reads (autopelt.study.optuna_private), checked against the installed
Optuna: a release that renames or changes one fails here, by name."""

from __future__ import annotations

import inspect
import time

import optuna
import pytest

from autopelt.study import optuna_private


@pytest.fixture
def study(tmp_path):
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=1)
    return optuna.create_study(storage=storage, study_name="s")


def test_a_study_holds_its_storage_and_its_id(study):
    storage = optuna_private.storage_of(study)
    assert isinstance(storage, optuna.storages.BaseStorage), "Study._storage is gone or changed"
    assert storage.get_heartbeat_interval() == 1  # the RDBStorage's, behind Optuna's cache
    assert optuna_private.study_id(study) == storage.get_study_id_from_name("s"), "Study._study_id changed"


def test_a_trial_and_its_frozen_record_hold_the_storage_id(study):
    trial = study.ask()
    storage, study_id = optuna_private.storage_of(study), optuna_private.study_id(study)
    expected = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    assert optuna_private.trial_id(trial) == expected, "Trial._trial_id changed"
    assert optuna_private.trial_id(study.trials[0]) == expected, "FrozenTrial._trial_id changed"


def test_stale_trials_are_found_without_being_failed(study):
    storage = optuna_private.storage_of(study)
    finder = getattr(storage, "_get_stale_trial_ids", None)
    assert finder is not None, "_get_stale_trial_ids is gone: recovery.interrupted_trials needs another way"
    assert list(inspect.signature(finder).parameters) == ["study_id"]
    trial = study.ask()
    storage.record_heartbeat(optuna_private.trial_id(trial))  # public: the controller's heartbeat thread
    assert optuna_private.stale_trial_ids(study) == set()
    time.sleep(2.2)
    assert optuna_private.stale_trial_ids(study) == {optuna_private.trial_id(trial)}
    assert study.trials[0].state == optuna.trial.TrialState.RUNNING  # found, not failed: its reason is still ours


def test_a_storage_without_heartbeats_has_no_stale_trials(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/plain.db")
    study.ask()
    assert optuna_private.stale_trial_ids(study) == set()
