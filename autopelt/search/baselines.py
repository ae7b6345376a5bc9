"""The baselines every study runs first: UniPELT(APL) and each single method at its paper's defaults.

They are queued as trials tagged with their preset's name (the `baseline` attribute; the spec comes from
`autopelt.delta.presets`), once per study: a later run queues only the ones no trial stands for yet.
"""

from __future__ import annotations

from typing import Callable

import optuna

from autopelt.search.claims import baseline_covered
from autopelt.study.record import queued_baseline


def baseline_hparams(name: str, epochs: int) -> dict:
    """A baseline keeps its paper structure; its learning rate is chosen for this task, model and budget by the
    trial itself (None: a sweep, autopelt.train.lr_sweep), and recorded with how it was chosen."""
    return {"learning_rate": None, "epochs": epochs}


def enqueue_missing(study: optuna.Study, names: list[str], params_of: Callable[[str], dict | None]) -> list[str]:
    """Queue each baseline no trial stands for yet, with the search space's parameters that draw its preset when
    the space can (`params_of`), so that the sampler learns from the baselines as from any trial; the names
    queued."""
    trials = study.get_trials(deepcopy=False)
    missing = [name for name in names if not baseline_covered(name, trials)]
    for name in missing:
        params = params_of(name)
        study.enqueue_trial(params or {}, user_attrs=queued_baseline(name, drawn=params is not None))
    return missing
