"""Which learning rate a trial of a search trains at, and why: the one place that decides.

A trial's kind (`TrialKind`, study/record.py) is read once, from what queued or drew it; `decide` gives the rate
from the kind and what the study knows so far (its trials, its portfolio):

- FINALIST: the rate of the trial it repeats (its sweep is not run twice; finalists.py).
- MEMBER: the rate recorded with the portfolio member (measured on the portfolio's model), times `factor` for a
  leader's variant (leaders.py), read as `--rates` says (`portfolio_rate`): as recorded ("absolute"); times this
  study's LoRA rate over LoRA's rate on the tasks the member was learned from ("calibrated"; as recorded where the
  study has no LoRA rate); times
  (H0 / H)^TRANSFER_POWER, H0 and H the two models' hidden sizes ("transfer").
- BASELINE: the rate learned for its preset with the portfolio, read alike; else it sweeps its own (no portfolio,
  none learned, or a calibrating study whose LoRA rate is not known yet).
- REFINEMENT and DRAWN: a space's `learning_rate: auto` is the geometric mean of the rates this study measured for
  the delta's families (`measured`) times the drawn `lr_scale` (refine.py draws a refinement's scale to put it at
  a factor of its baseline's rate); with none measured it sweeps. A rate the space draws as a number stays.
- A trial left without a rate sweeps its own (`learning_rate` None in TrialSettings; train/lr_sweep.py).

Every trial records why (`lr_from`, with `why` one of the names below). The family rates: a single-method baseline
that sweeps measures its family's rate, so the sampler searches a narrow range around rates that learn on this
task, model and budget, instead of four decades of which most learn nothing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from autopelt.delta import registry
from autopelt.delta.presets import PRESETS
from autopelt.delta.spec import parse_spec
from autopelt.errors import UserError
from autopelt.portfolio.portfolio import CALIBRATION_BASELINE
from autopelt.study.record import TrialKind, TrialRecord, baseline_of, read

# why a trial trains at its rate: the rule that decided
FINALIST = "finalist: the rate of the trial it repeats"
MEMBER = "portfolio member: its recorded rate"
CALIBRATED = "portfolio: its recorded rate calibrated to this study's LoRA rate"
TRANSFERRED = "portfolio: its recorded rate transferred by hidden size"
LEARNED = "baseline: the rate learned with the portfolio"
FAMILY = "measured family rate x lr_scale"
DRAWN = "drawn by the space"
SWEEP = "sweep"

AUTO = "auto"  # a space's `learning_rate: auto`


@dataclass(frozen=True)
class Rate:
    hparams: dict  # the trial's training hyper-parameters, `learning_rate` the rate it trains at (None: a sweep)
    why: str  # the rule that decided (one of the names above)
    lr_from: dict = field(default_factory=dict)  # what the trial records: `why` and the rule's account


def decide(kind: TrialKind, hparams: dict, *, trials: Sequence = (), portfolio=None, spec: dict | None = None,
           baseline: str | None = None, repeats: float | None = None, factor: float = 1.0) -> Rate:
    """The rate a trial of `kind` trains at, and why.

    Args:
        kind: the trial's kind (record.kind_of).
        hparams: its training hyper-parameters as its source gave them (drawn, recorded or a preset's).
        trials: the study's trials so far (FrozenTrials or TrialRecords): its LoRA rate and measured family rates.
        portfolio: the study's portfolio (autopelt.portfolio.Portfolio) or None.
        spec: the trial's delta spec (a drawn delta's families).
        baseline: a baseline's preset name.
        repeats: a finalist's: the rate the trial it repeats trained at.
        factor: a member's: times its recorded rate (a leader's variant, leaders.py; 1 for the member itself).
    """
    if kind is TrialKind.FINALIST:
        return _rate({**hparams, "learning_rate": hparams.get("learning_rate") if repeats is None else repeats},
                     FINALIST)
    if kind is TrialKind.MEMBER:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < math.inf:
            raise UserError(f"a portfolio member was queued at a rate factor of {factor!r}")
        rate, account = portfolio_rate(portfolio, hparams["learning_rate"] * factor, _lora_rate(portfolio, trials))
        return _rate({**hparams, "learning_rate": rate}, account.pop("why", MEMBER), account)
    if kind is TrialKind.BASELINE:
        learned = (portfolio.baseline_rates if portfolio is not None else {}).get(baseline)
        lora = _lora_rate(portfolio, trials)
        if learned is None or (portfolio.calibrate and not lora):  # a calibration not known yet: sweep
            return _rate({**hparams, "learning_rate": None}, SWEEP)
        rate, account = portfolio_rate(portfolio, learned, lora)
        return _rate({**hparams, "learning_rate": rate}, LEARNED, account)
    hparams = dict(hparams)
    scale = hparams.pop("lr_scale", 1.0)
    if hparams.get("learning_rate") != AUTO:
        return _rate(hparams, DRAWN if hparams.get("learning_rate") is not None else SWEEP)
    reference, known = reference_rate(spec or {}, measured(_records(trials)))
    if reference is None:
        return _rate({**hparams, "learning_rate": None}, SWEEP, {"how": "sweep", "scale": scale})
    return _rate({**hparams, "learning_rate": reference * scale}, FAMILY,
                 {"how": "baselines", "reference": reference, "scale": scale, "families": known})


def _rate(hparams: dict, why: str, account: dict | None = None) -> Rate:
    return Rate(hparams, why, {**(account or {}), "why": why})


def portfolio_rate(portfolio, recorded: float, lora_rate: float | None) -> tuple[float, dict]:
    """(the rate a member's or learned baseline's `recorded` rate trains at, its account): calibrated by the study's
    LoRA rate where the portfolio calibrates and the rate is known; transferred by its scale where it transfers;
    else `recorded`. The account names the rule (`why`) where it changed the rate."""
    reference = portfolio.reference_rate
    if portfolio.calibrate and reference is not None and lora_rate:
        return recorded * lora_rate / reference, {"why": CALIBRATED, "how": "calibrated", "recorded": recorded,
                                                  "reference": reference, "calibration": lora_rate,
                                                  "scale": recorded / reference}
    if portfolio.transfer != 1.0:
        return float(f"{recorded * portfolio.transfer:.3g}"), {"why": TRANSFERRED, "how": "transfer",
                                                               "recorded": recorded, "scale": portfolio.transfer}
    return recorded, {}


def _lora_rate(portfolio, trials: Sequence) -> float | None:
    """The study's LoRA rate, where its portfolio calibrates and the LoRA baseline has one."""
    if portfolio is None or not portfolio.calibrate:
        return None
    return calibration(trials)[1]


def calibration(trials: Iterable) -> tuple[bool, float | None]:
    """(settled, the study's LoRA rate): the rate its LoRA baseline chose by its sweep and trained to the end at;
    settled with None where no LoRA baseline is queued or running and none has one (it failed, or a wall-time
    budget left it no time): the members then train at their recorded rates."""
    from optuna.trial import TrialState

    alive = False
    for trial in trials:
        if (trial.baseline if isinstance(trial, TrialRecord) else baseline_of(trial)) != CALIBRATION_BASELINE:
            continue
        run = trial if isinstance(trial, TrialRecord) else read(trial)
        if run.is_answer and run.learning_rate:
            return True, run.learning_rate
        alive = alive or run.state in (TrialState.WAITING, TrialState.RUNNING)
    return not alive, None


def _records(trials: Iterable) -> list[TrialRecord]:
    return [t if isinstance(t, TrialRecord) else read(t) for t in trials]


# -- the rates a study has measured for each family ---------------------------------------------------------

@functools.cache
def baseline_family(name: str | None) -> str | None:
    """The family whose rate a baseline (its preset's name) measures: its one method's family; None for a
    combination (UniPELT measures no one family) or a name that is no preset."""
    methods = PRESETS.get(name or "", {}).get("methods", [])
    return family(parse_spec({"methods": methods}).methods[0]) if len(methods) == 1 else None


def family(entry) -> str:
    """The family a method entry's rate comes from (its registry entry's `rate_family`: dense adapters share one,
    PHM/Compacter another, AdaMix trains at its inner delta's)."""
    return registry.rate_family(entry)


def families(spec: dict) -> list[str]:
    return sorted({family(entry) for entry in parse_spec(spec).methods})


def measured(trials: Iterable[TrialRecord]) -> dict[str, float]:
    """Family -> the rate its single-method baseline chose and trained to the end at; for a family no baseline
    measured, the rate of its best single-family portfolio member trained to the end."""
    trials = list(trials)
    rates, best = {}, {}
    for trial in trials:
        family_ = baseline_family(trial.baseline)
        if family_ and trial.is_answer and trial.learning_rate:
            rates[family_] = trial.learning_rate
    for trial in trials:  # else the best single-family portfolio member's rate
        if not (trial.portfolio and trial.is_answer and trial.learning_rate and trial.spec and trial.values):
            continue
        names = families(trial.spec)
        if len(names) == 1 and names[0] not in rates and trial.values[0] > best.get(names[0], (float("-inf"),))[0]:
            best[names[0]] = (trial.values[0], trial.learning_rate)
    return {**{name: rate for name, (_, rate) in best.items()}, **rates}


def reference_rate(spec: dict, rates: dict[str, float]) -> tuple[float | None, dict[str, float]]:
    """The geometric mean of the measured rates of the spec's families (those measured), and those rates;
    (None, {}) when no family of the spec has one yet."""
    known = {name: rates[name] for name in families(spec) if name in rates}
    if not known:
        return None, {}
    return math.exp(sum(math.log(rate) for rate in known.values()) / len(known)), known
