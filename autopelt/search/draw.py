"""What a trial trains, by its kind (`TrialKind`, study/record.py): its delta and training hyper-parameters from
their source (the trial a finalist repeats, a portfolio member, a baseline's preset, or the space's draw), at the
rate rate_policy decides."""

from __future__ import annotations

import optuna

from autopelt.delta.presets import PRESETS
from autopelt.errors import UserError
from autopelt.search import finalists, portfolio_phase, rate_policy
from autopelt.search.baselines import baseline_hparams, baseline_spec
from autopelt.search.plan import SearchPlan
from autopelt.study import record
from autopelt.study.record import TrialKind


def draw_trial(plan: SearchPlan, study: optuna.Study, trial: optuna.Trial, kind: TrialKind, baseline: str | None,
               baseline_pooling: str) -> tuple[dict, rate_policy.Rate]:
    """(spec, rate) of a live trial: its delta spec, and its hyper-parameters at their rate with why (`lr_from`,
    for the controller to record). A queued member or baseline that carries the space's parameters is drawn by the
    space too, so that the sampler learns from it. Raises UserError for a source that cannot be read."""
    repeats = None
    if kind is TrialKind.FINALIST:
        again = record.finalist_of(trial)["trial"]
        original = next((t for t in study.get_trials(deepcopy=False) if t.number == again), None)
        if original is None:
            raise UserError(f"trial {again}, queued as a finalist, is not in the study")
        original = record.read(original)
        (spec, hparams), repeats = finalists.settings_of(original), original.learning_rate
    elif kind is TrialKind.MEMBER:
        if record.portfolio_of(trial).get("drawn"):
            plan.space.sample(trial, plan.num_layers)
        spec, hparams = portfolio_phase.spec_and_hparams(plan, record.portfolio_of(trial))
    elif kind is TrialKind.BASELINE:
        if baseline not in PRESETS:
            raise UserError(f"unknown baseline {baseline!r}")
        if record.is_drawn_baseline(trial):
            plan.space.sample(trial, plan.num_layers)
        spec, hparams = baseline_spec(baseline, baseline_pooling), baseline_hparams(plan.epochs)
    else:
        spec, hparams = plan.space.sample(trial, plan.num_layers)
    rate = rate_policy.decide(kind, hparams, trials=study.get_trials(deepcopy=False), portfolio=plan.portfolio,
                              spec=spec, baseline=baseline, repeats=repeats,
                              factor=record.portfolio_of(trial).get("factor", 1.0))
    return spec, rate
