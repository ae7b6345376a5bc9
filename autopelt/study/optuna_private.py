"""The one module that reads Optuna's private attributes, for what Optuna 5 offers no public way to do.

- `storage_of(study)`: the storage a study writes to (`Study._storage`). Storage methods such as
  `record_heartbeat`, `set_trial_user_attr` and `set_trial_state_values` are public, but reaching them from a
  study is not; Optuna's own `fail_stale_trials` reads the same attribute.
- `trial_id(trial)`: the storage id of a `Trial` or `FrozenTrial` (`_trial_id`), which those methods take.
- `study_id(study)`: the storage id of a study (`Study._study_id`), in optuna-dashboard's page addresses.
- `stale_trial_ids(study)`: RUNNING trials whose heartbeat is older than the storage's grace period
  (`RDBStorage._get_stale_trial_ids`, on the database's clock). The public `optuna.storages.fail_stale_trials`
  asks the same question but fails the trials itself, after which a trial's user attributes can no longer be set:
  the search could not record why it failed (`interrupted`) nor fail it only once among several controllers.

tests/test_optuna_private.py checks each of these against the installed Optuna, so a release that renames one
fails there, by name, rather than in a search that quietly stops recovering its trials.
"""

from __future__ import annotations

import optuna
from optuna.storages import BaseStorage


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage `study` reads and writes."""
    return study._storage


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of `trial` (not its number within the study)."""
    return trial._trial_id


def study_id(study: optuna.Study) -> int:
    """The storage's id of `study`."""
    return study._study_id


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """Storage ids of the study's RUNNING trials whose heartbeat is older than the storage's grace period; empty
    when the storage keeps no heartbeats."""
    storage = storage_of(study)
    interval = getattr(storage, "get_heartbeat_interval", None)  # RDBStorage (behind Optuna's cache) has it
    if interval is None or not interval():
        return set()
    return set(storage._get_stale_trial_ids(study_id(study)))
