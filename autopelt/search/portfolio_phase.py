"""The portfolio's place in a search: its members are queued first (after the baselines), in order, once per
study, each tagged with its name and rank; early stopping (ASHA) makes successive halving of them, except the
first, which always trains to the end. The sampler then draws, and learns from every finished trial.
"""

from __future__ import annotations

from typing import Callable

import optuna
from optuna.trial import TrialState

from autopelt.portfolio.portfolio import CALIBRATION_BASELINE
from autopelt.search.claims import ALIVE
from autopelt.study.record import attrs, baseline_of, portfolio_of, read


def enqueue_missing(study: optuna.Study, members, params_of: Callable) -> list[str]:
    """Queue each member that no trial is queued, running or trained for (one that failed in an earlier run runs
    again, ahead of the sampler); the names queued."""
    have = {portfolio_of(t).get("name") for t in study.get_trials(deepcopy=False) if t.state in ALIVE}
    queued = []
    for rank, member in enumerate(members):
        if member.name in have:
            continue
        params = params_of(member)
        tag = {"name": member.name, "rank": rank, **({"drawn": True} if params is not None else {})}
        study.enqueue_trial(params or {}, user_attrs=attrs(portfolio=tag))
        queued.append(member.name)
    return queued


def calibration(trials) -> tuple[bool, float | None]:
    """(settled, the study's LoRA rate): the rate its LoRA baseline chose by its sweep and trained to the end at
    (portfolio.py's calibration); settled with None where no LoRA baseline is queued or running and none has one
    (it failed, or a wall-time budget left it no time): the members then train at their recorded rates."""
    alive = False
    for trial in trials:
        if baseline_of(trial) != CALIBRATION_BASELINE:
            continue
        run = read(trial)
        if run.is_answer and run.learning_rate:
            return True, run.learning_rate
        alive = alive or trial.state in (TrialState.WAITING, TrialState.RUNNING)
    return not alive, None


def spec_and_hparams(plan, tag: dict) -> tuple[dict, dict]:
    """What a queued member trains: its spec for this model and its recorded rate, batch and backbone dropout."""
    from autopelt.errors import UserError

    members = {m.name: (i, m) for i, m in enumerate(plan.portfolio.members)} if plan.portfolio else {}
    if tag.get("name") not in members:
        raise UserError(f"portfolio member {tag.get('name')!r} was queued by another portfolio; resume with the "
                        "same --portfolio")
    index, member = members[tag["name"]]
    return member.spec(plan.num_layers), plan.portfolio.hparams(index, plan.epochs)
