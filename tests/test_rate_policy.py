"""The learning-rate policy: a trial's kind decides which rule sets its rate, every rule says so (`why`, recorded in
`lr_from`), and no other module of the search sets a trial's rate."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autopelt.delta.presets import PRESETS
from autopelt.portfolio.config import Config
from autopelt.portfolio.portfolio import Portfolio
from autopelt.search import rate_policy as policy
from autopelt.study.record import TrialKind, TrialRecord

LORA = PRESETS["lora"]
ROOT = Path(__file__).resolve().parents[1]


def _portfolio(**changes) -> Portfolio:
    member = Config("lora-r8-qv@3e-3", (dict(LORA["methods"][0]),), 3e-3)
    return dataclasses.replace(Portfolio("all-MiniLM-L6-v2", (member,), "p.json", {}, baseline_rates={"lora": 1e-3},
                                         calibration={"a": 2e-3}), **changes)


def _trained(number: int, rate: float, baseline: str | None = None, **fields) -> TrialRecord:
    return TrialRecord(number, TrialState.COMPLETE, values=fields.pop("values", (0.8,)), full_fidelity=True,
                       dev={"accuracy": 0.8}, baseline=baseline, learning_rate=rate, spec=fields.pop("spec", LORA),
                       **fields)


LORA_SWEPT = _trained(0, 4e-3, baseline="lora")  # the study's LoRA baseline swept to 4e-3


def test_a_finalist_keeps_the_rate_of_the_trial_it_repeats_over_every_other_source():
    rate = policy.decide(TrialKind.FINALIST, {"learning_rate": 1e-2}, trials=[LORA_SWEPT], portfolio=_portfolio(),
                         spec=LORA, baseline="lora", repeats=3e-3)
    assert rate.hparams["learning_rate"] == 3e-3 and rate.why == policy.FINALIST
    assert rate.lr_from == {"why": policy.FINALIST}


def test_a_member_trains_at_its_recorded_rate_calibrated_or_transferred_as_the_study_says():
    recorded = policy.decide(TrialKind.MEMBER, {"learning_rate": 3e-3, "batch_size": 16}, trials=[LORA_SWEPT],
                             portfolio=_portfolio(), spec=LORA)
    assert recorded.hparams == {"learning_rate": 3e-3, "batch_size": 16} and recorded.why == policy.MEMBER
    calibrated = policy.decide(TrialKind.MEMBER, {"learning_rate": 3e-3}, trials=[LORA_SWEPT],
                               portfolio=_portfolio(calibrate=True))
    assert calibrated.hparams["learning_rate"] == pytest.approx(3e-3 * 4e-3 / 2e-3)  # x this LoRA over the reference
    assert calibrated.why == policy.CALIBRATED and calibrated.lr_from["how"] == "calibrated"
    assert calibrated.lr_from["calibration"] == 4e-3 and calibrated.lr_from["scale"] == pytest.approx(1.5)
    not_yet = policy.decide(TrialKind.MEMBER, {"learning_rate": 3e-3}, trials=[], portfolio=_portfolio(calibrate=True))
    assert not_yet.hparams["learning_rate"] == 3e-3 and not_yet.why == policy.MEMBER  # no LoRA rate: as recorded
    moved = policy.decide(TrialKind.MEMBER, {"learning_rate": 3e-3}, portfolio=_portfolio(transfer=0.5))
    assert moved.hparams["learning_rate"] == 1.5e-3 and moved.why == policy.TRANSFERRED
    assert moved.lr_from == {"why": policy.TRANSFERRED, "how": "transfer", "recorded": 3e-3, "scale": 0.5}


def test_a_baseline_trains_at_its_learned_rate_read_like_the_members_else_sweeps():
    learned = policy.decide(TrialKind.BASELINE, {"epochs": 3}, portfolio=_portfolio(), baseline="lora")
    assert learned.hparams == {"epochs": 3, "learning_rate": 1e-3} and learned.why == policy.LEARNED
    moved = policy.decide(TrialKind.BASELINE, {}, portfolio=_portfolio(transfer=0.5), baseline="lora")
    assert moved.hparams["learning_rate"] == 5e-4 and moved.lr_from["how"] == "transfer"
    calibrated = policy.decide(TrialKind.BASELINE, {}, trials=[LORA_SWEPT], portfolio=_portfolio(calibrate=True),
                               baseline="lora")
    assert calibrated.hparams["learning_rate"] == pytest.approx(2e-3) and calibrated.why == policy.LEARNED
    for portfolio, trials in ((None, []), (_portfolio(), []), (_portfolio(calibrate=True), [])):
        baseline = "adapter" if portfolio is not None and not portfolio.calibrate else "lora"  # none learned
        swept = policy.decide(TrialKind.BASELINE, {"epochs": 3}, trials=trials, portfolio=portfolio,
                              baseline=baseline)
        assert swept.hparams["learning_rate"] is None and swept.why == policy.SWEEP
        assert swept.lr_from == {"why": policy.SWEEP}


@pytest.mark.parametrize("kind", [TrialKind.DRAWN, TrialKind.REFINEMENT])
def test_a_drawn_auto_rate_is_the_measured_family_rate_times_lr_scale(kind):
    rate = policy.decide(kind, {"learning_rate": "auto", "lr_scale": 0.5}, trials=[LORA_SWEPT], spec=LORA)
    assert rate.hparams == {"learning_rate": pytest.approx(2e-3)} and rate.why == policy.FAMILY
    assert rate.lr_from["how"] == "baselines" and rate.lr_from["families"] == {"lora": 4e-3}
    none = policy.decide(kind, {"learning_rate": "auto", "lr_scale": 0.5}, trials=[LORA_SWEPT],
                         spec=PRESETS["prompt"])
    assert none.hparams == {"learning_rate": None} and none.why == policy.SWEEP
    assert none.lr_from == {"how": "sweep", "scale": 0.5, "why": policy.SWEEP}


def test_a_number_the_space_draws_stays_and_nothing_else_sweeps():
    drawn = policy.decide(TrialKind.DRAWN, {"learning_rate": 7e-4}, trials=[LORA_SWEPT], spec=LORA)
    assert drawn.hparams == {"learning_rate": 7e-4} and drawn.why == policy.DRAWN
    unset = policy.decide(TrialKind.DRAWN, {"epochs": 3}, spec=LORA)
    assert unset.hparams.get("learning_rate") is None and unset.why == policy.SWEEP


def test_a_family_no_baseline_measured_takes_its_best_single_family_members_rate():
    members = [_trained(1, 2e-3, portfolio={"name": "a", "rank": 0}, spec=PRESETS["adapter"], values=(0.7,)),
               _trained(2, 6e-3, portfolio={"name": "b", "rank": 1}, spec=PRESETS["adapter"], values=(0.9,))]
    assert policy.measured([LORA_SWEPT, *members]) == {"lora": 4e-3, "adapter": 6e-3}


def test_a_single_method_baseline_measures_its_methods_rate_family_and_a_combination_none():
    from autopelt.delta.presets import BASELINES

    assert {name: policy.baseline_family(name) for name in (*BASELINES, "prompt", "dora", None)} == {
        "unipelt_apl": None, "lora": "lora", "adapter": "adapter", "bitfit": "bitfit", "prefix": "prefix",
        "compacter": "compacter", "prompt": "prompt", "dora": "lora", None: None}
    compacter = _trained(1, 8e-3, baseline="compacter", spec=PRESETS["compacter"])
    unipelt = _trained(2, 5e-4, baseline="unipelt_apl", spec=PRESETS["unipelt_apl"])
    assert policy.measured([LORA_SWEPT, compacter, unipelt]) == {"lora": 4e-3, "compacter": 8e-3}


def test_no_module_of_the_search_but_the_policy_sets_a_trials_learning_rate():
    """A rate rule elsewhere (a calibration, a scale, a fallback) would be a second place that decides."""
    setting = re.compile(r"""["']learning_rate["']\s*\]\s*=(?!=)|["']learning_rate["']\s*:(?!\s*member\.)"""
                         r"""|learning_rate\s*=\s*[\w.]*rate|\breplace\(.*\blearning_rate\s*=""")
    offenders = []
    for path in (*sorted((ROOT / "autopelt" / "search").glob("*.py")), ROOT / "autopelt/portfolio/portfolio.py"):
        if path.name in ("rate_policy.py", "space_schema.py"):  # the policy; the space's schema names the field
            continue
        offenders += [f"{path.name}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                      if setting.search(line) and not line.lstrip().startswith("#")]
    assert offenders == []
