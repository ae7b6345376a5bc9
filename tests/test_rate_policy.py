"""The learning-rate policy's order: each rule wins where it should, and says so (`why`)."""

from __future__ import annotations

import pytest

from autopelt.delta.presets import PRESETS
from autopelt.search import rate_policy as policy

LORA = PRESETS["lora"]
MEASURED = {"lora": 4e-3}
LEARNED = {"lora": 1e-3}


def test_a_finalist_keeps_the_rate_of_the_trial_it_repeats_over_every_other_source():
    rate = policy.trial_rate({"learning_rate": None, "lr_scale": 2.0}, repeats_rate=3e-3, member_rate=1e-2,
                             baseline="lora", learned=LEARNED, spec=LORA, measured=MEASURED)
    assert rate.hparams["learning_rate"] == 3e-3 and rate.why == policy.FINALIST and rate.lr_from == {}


def test_a_portfolio_member_trains_at_its_recorded_rate_over_a_baseline_or_family_rate():
    rate = policy.trial_rate({"learning_rate": 5e-4, "batch_size": 16}, member_rate=5e-4, baseline="lora",
                             learned=LEARNED, spec=LORA, measured=MEASURED)
    assert rate.hparams == {"learning_rate": 5e-4, "batch_size": 16} and rate.why == policy.MEMBER


def test_a_baseline_trains_at_its_learned_rate_else_sweeps_and_never_at_the_family_rate():
    learned = policy.trial_rate({"epochs": 3}, baseline="lora", learned=LEARNED, spec=LORA, measured=MEASURED)
    assert learned.hparams == {"epochs": 3, "learning_rate": 1e-3} and learned.why == policy.LEARNED
    for portfolio_rates in (None, {"adapter": 1e-3}):  # no portfolio, or none learned for this baseline
        swept = policy.trial_rate({"epochs": 3}, baseline="lora", learned=portfolio_rates, spec=LORA,
                                  measured=MEASURED)
        assert swept.hparams["learning_rate"] is None and swept.why == policy.SWEEP and swept.lr_from == {}


def test_a_drawn_auto_rate_is_the_measured_family_rate_times_lr_scale_and_records_why():
    rate = policy.trial_rate({"learning_rate": "auto", "lr_scale": 0.5}, spec=LORA, measured=MEASURED)
    assert rate.hparams == {"learning_rate": pytest.approx(2e-3)} and rate.why == policy.FAMILY
    assert rate.lr_from["how"] == "baselines" and rate.lr_from["why"] == policy.FAMILY


def test_a_drawn_auto_rate_with_no_measured_family_sweeps():
    rate = policy.trial_rate({"learning_rate": "auto", "lr_scale": 0.5}, spec=PRESETS["prompt"], measured=MEASURED)
    assert rate.hparams == {"learning_rate": None} and rate.why == policy.SWEEP
    assert rate.lr_from == {"how": "sweep", "scale": 0.5, "why": policy.SWEEP}


def test_a_number_the_space_draws_stays_and_nothing_else_sweeps():
    drawn = policy.trial_rate({"learning_rate": 7e-4}, spec=LORA, measured=MEASURED)
    assert drawn.hparams == {"learning_rate": 7e-4} and drawn.why == policy.DRAWN and drawn.lr_from == {}
    unset = policy.trial_rate({"epochs": 3}, spec=LORA, measured=MEASURED)
    assert unset.hparams.get("learning_rate") is None and unset.why == policy.SWEEP and unset.lr_from == {}
