"""The baselines every study runs first: UniPELT(APL), and without a portfolio each single method at its paper's
defaults.

They are queued as trials tagged with their preset's name (the `baseline` attribute; the spec comes from
`autopelt.delta.presets`), once per study: a later run queues only the ones no trial stands for yet.

They take at most half of a budget, so that a study always searches: on a trial budget at most half its trials
(`phases.baselines_for`), on a wall-time budget they start in its first half (WALL_SHARE; a baseline costs about two
trials, its rate sweep: docs/search.md). One not started is recorded as FAIL, `claims.LATE_BASELINE`, and queued
again by a later run of the study, whose budget may hold it.
"""

from __future__ import annotations

from typing import Callable

import optuna

from optuna.trial import FrozenTrial, TrialState

from autopelt.delta.presets import PRESETS
from autopelt.delta.spec import with_pooling
from autopelt.search.claims import LATE_BASELINE, baseline_alive, baseline_covered
from autopelt.study.record import queued_baseline, read

WALL_SHARE = 0.5  # of a wall-time budget in which baselines may start


def baseline_spec(name: str, pooling: str) -> dict:
    """A baseline's delta: its preset, the paper's structure, with the head reading the sequence as the model was
    trained to be read (`pooling`, models.own_pooling): the mean of the token states for a sentence-transformers
    checkpoint, whose BERT pooler was never trained, else the first token, as the papers' BERT and RoBERTa."""
    return with_pooling(PRESETS[name], pooling)


def baseline_hparams(epochs: int) -> dict:
    """A baseline keeps its paper structure and trains for the study's `epochs`; its learning rate is the one
    rate_policy gives a baseline (learned with the study's portfolio, else a sweep)."""
    return {"epochs": epochs}


def enqueue_missing(study: optuna.Study, names: list[str], params_of: Callable[[str], dict | None]) -> list[str]:
    """Queue each baseline that no trial is queued, running or trained for (one that failed, in an earlier run
    with a wrong --data-dir say, runs again), with the search space's parameters that draw its preset when the
    space can (`params_of`), so that the sampler learns from the baselines as from any trial; the names queued."""
    trials = study.get_trials(deepcopy=False)
    missing = [name for name in names if not baseline_alive(name, trials)]
    for name in missing:
        params = params_of(name)
        study.enqueue_trial(params or {}, user_attrs=queued_baseline(name, drawn=params is not None))
    return missing


def too_late(elapsed: float, deadline: float | None) -> bool:
    """No baseline starts `elapsed` seconds into a wall-time budget of `deadline` seconds (None: a trial budget)."""
    return deadline is not None and elapsed >= WALL_SHARE * deadline


def in_play(names: list[str], trials: list[FrozenTrial]) -> list[str]:
    """The study's baselines less those a wall-time budget left no time to start (no other trial stands for them):
    the ones the refinements and the finalists' room wait for."""
    late = {r.baseline for r in map(read, trials) if r.state == TrialState.FAIL and r.fail_reason == LATE_BASELINE}
    return [name for name in names if name not in late or baseline_covered(name, trials)]
