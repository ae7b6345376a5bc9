"""Which learning rate a trial of a search trains at: the one place that decides, in this order.

1. A finalist trains at the rate the trial it repeats trained at (its sweep is not run twice; confirm.py).
2. A portfolio member trains at the rate recorded with it (`Portfolio.hparams`; portfolio/portfolio.py), which a
   study that calibrates has scaled by its LoRA rate first (`Portfolio.calibrated_rate`).
3. A baseline trains at the rate learned for it with the study's portfolio (`Portfolio.baseline_rates`, calibrated
   alike), else it sweeps its own (`SWEEP`).
4. A delta the space draws with `learning_rate: auto` trains at the measured rate of its families times the drawn
   `lr_scale` (learning_rates.resolve); a refinement is such a delta, whose `lr_scale` refine.py chose to put it at
   a factor of its baseline's rate. A rate the space draws itself (a number) stays as drawn.
5. Otherwise the trial sweeps its own: `learning_rate` None in TrialSettings, train/lr_sweep.py.

The modules named keep their computations (the sweep, the measured family rates, the recorded and learned rates);
only which of them wins is stated here. The controller asks `trial_rate` for every trial it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from autopelt.search import learning_rates

# why a trial trains at its rate: the rule that decided
FINALIST = "finalist: the rate of the trial it repeats"
MEMBER = "portfolio member: its recorded rate"
LEARNED = "baseline: the rate learned with the portfolio"
FAMILY = "measured family rate x lr_scale"
DRAWN = "drawn by the space"
SWEEP = "sweep"


@dataclass(frozen=True)
class Rate:
    hparams: dict  # the trial's training hyper-parameters, `learning_rate` the rate it trains at (None: a sweep)
    why: str  # the rule that decided (one of the names above)
    lr_from: dict = field(default_factory=dict)  # a drawn `auto` rate's account (the trial's `lr_from`), else {}


def trial_rate(hparams: dict, *, repeats_rate: float | None = None, member_rate: float | None = None,
               baseline: str | None = None, learned: Mapping[str, float] | None = None, spec: dict | None = None,
               measured: Mapping[str, float] | None = None) -> Rate:
    """The rate a trial trains at, and why.

    Args:
        hparams: the trial's training hyper-parameters as its source gave them (drawn, recorded or a preset's).
        repeats_rate: for a finalist, the rate the trial it repeats trained at.
        member_rate: for a portfolio member, its recorded rate.
        baseline: for a baseline, its preset's name; `learned`: the portfolio's baseline rates (None: no portfolio).
        spec: for a drawn delta, its spec; `measured`: the study's measured family rates (learning_rates.measured).

    Returns:
        A `Rate`; `lr_from` is non-empty only for a drawn delta whose space says `learning_rate: auto`, and then
        names the rule (`why`) beside learning_rates.resolve's account.
    """
    if repeats_rate is not None:
        return Rate({**hparams, "learning_rate": repeats_rate}, FINALIST)
    if member_rate is not None:
        return Rate({**hparams, "learning_rate": member_rate}, MEMBER)
    if baseline is not None:
        rate = (learned or {}).get(baseline)
        return Rate({**hparams, "learning_rate": rate}, SWEEP if rate is None else LEARNED)
    resolved, lr_from = learning_rates.resolve(spec or {}, hparams, dict(measured or {}))
    rate = resolved.get("learning_rate")
    why = SWEEP if rate is None else FAMILY if lr_from.get("how") == "baselines" else DRAWN
    return Rate(resolved, why, {**lr_from, "why": why} if lr_from else {})
