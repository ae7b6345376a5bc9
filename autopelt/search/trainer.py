"""The real trial function: a search trial's config -> `autopelt.train.run_trial` (runs inside a Ray worker)."""

from __future__ import annotations

import dataclasses
from typing import Callable

# config keys that are trial settings as they are (the rest of a settings record comes from `hparams`)
_DIRECT = ("task", "custom_task", "spec", "model", "data_dir", "protocol", "seed", "epochs", "threads", "device",
           "autocast", "out_dir")


def settings_dict(config: dict, known: set[str]) -> dict:
    """The TrialSettings fields for a trial config: the space's training hyper-parameters, then the trial's
    own fields; `data_seed` is the study's seed, so every trial sees the same train/dev rows."""
    hparams = {k: v for k, v in config.get("hparams", {}).items() if k in known}
    direct = {k: config[k] for k in _DIRECT if k in known and config.get(k) is not None}
    return {**hparams, **direct, "data_seed": config.get("seed", 0)}


def train_trial(config: dict, report: Callable[[dict], None]) -> dict:
    from autopelt.train import TrialSettings, run_trial

    known = {f.name for f in dataclasses.fields(TrialSettings)}
    return run_trial(TrialSettings.from_dict(settings_dict(config, known)), report=report)
