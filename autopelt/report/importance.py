"""Which searched hyperparameters mattered for the dev metric: Optuna's importances over the answer trials.

Baselines carry no parameters and early-stopped trials were judged at a lower fidelity, so the importances
are computed on a throwaway in-memory study holding only the searched answer trials, with the dev metric as
its single objective (Optuna's default PED-ANOVA evaluator then ranks by the study's own direction).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable

from autopelt.study.record import TrialRecord

MIN_TRIALS = 2


@dataclass(frozen=True)
class Importances:
    values: dict[str, float]  # parameter -> importance, largest first, summing to 1; empty with a note
    trials: int  # searched answer trials with parameters
    note: str | None = None  # why there are no importances


def param_importances(trials: Iterable[TrialRecord], maximize: bool = True) -> Importances:
    import optuna

    used = [t for t in trials if t.is_answer and t.baseline is None and t.params]
    if len(used) < MIN_TRIALS:
        return Importances({}, len(used), f"not enough trials: {len(used)} complete full-fidelity searched "
                                          f"trial(s) with parameters, {MIN_TRIALS} needed")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "a new study created in memory" line
    try:
        study = optuna.create_study(direction="maximize" if maximize else "minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials([
        optuna.trial.create_trial(params=t.params, distributions=t.distributions, value=t.values[0])
        for t in used
    ])
    with warnings.catch_warnings():  # few trials: Optuna warns that importances may be rough
        warnings.simplefilter("ignore")
        values = optuna.importance.get_param_importances(study)
    return Importances({name: float(value) for name, value in values.items()}, len(used))
