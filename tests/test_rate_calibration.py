"""A portfolio's rates calibrated to the study's own LoRA rate (autopelt/portfolio/portfolio.py): the file's
calibration, which studies calibrate, the LoRA baseline's sweep run first, the members held until its rate is known
and then trained at their recorded rate times it over the reference. The controller runs on the synthetic
objective of tests/support/fakes.py (a swept trial "chooses" fakes.SWEPT_RATE)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from support import fakes
from support.configs import BY_NAME

from autopelt.errors import UserError
from autopelt.portfolio import build
from autopelt.portfolio.portfolio import for_search, load, to_file
from autopelt.search.controller import WAIT
from autopelt.search.rate_policy import portfolio_rate
from autopelt.study.record import read_all
from test_portfolio import _study

MEMBERS = ("lora-r8-qv@3e-3", "lora-r8-qv-b16@2e-3", "pfeiffer-48@1e-3")
CALIBRATION = {"a": 1e-3, "b": 4e-3}  # the reference: their geometric mean, 2e-3


def _portfolio(path, calibration=CALIBRATION, model="all-MiniLM-L6-v2"):
    to_file([BY_NAME[m] for m in MEMBERS], model, {"tasks": ["a", "b"]}, path, {"unipelt_apl": 1e-3},
            calibration=calibration)
    return path


def test_the_reference_is_loras_rate_on_the_tasks_the_members_came_from(tmp_path):
    portfolio = load(_portfolio(tmp_path / "p.json"))
    assert portfolio.calibration == CALIBRATION and math.isclose(portfolio.reference_rate, 2e-3)
    nearest = dataclasses.replace(portfolio, reference_tasks=("b",))  # the prior chose them from task b alone
    assert math.isclose(nearest.reference_rate, 4e-3)
    calibrating = dataclasses.replace(portfolio, calibrate=True)
    rate, account = portfolio_rate(calibrating, 3e-3, lora_rate=5e-4)  # this model's LoRA wants 4x less
    assert math.isclose(rate, 7.5e-4) and account["how"] == "calibrated" and math.isclose(account["scale"], 1.5)
    assert portfolio_rate(calibrating, 3e-3, lora_rate=None) == (3e-3, {})  # no LoRA rate: as recorded
    assert portfolio_rate(portfolio, 3e-3, lora_rate=5e-4) == (3e-3, {})  # a study that does not calibrate


def test_rates_stay_as_measured_unless_calibrated_is_asked_for_and_one_line_says_which(tmp_path):
    path = str(_portfolio(tmp_path / "p.json", model="my-model"))
    same, line = for_search(path, "my-model", "default")
    assert not same.calibrate and "rates:" not in line and "learned on my-model" in line
    forced, line = for_search(path, "my-model", "default", rates="calibrated")
    assert forced.calibrate and "rates: calibrated" in line
    shipped, line = for_search("auto", "SmolLM2-135M-Instruct", "default")  # the shipped one, on another model
    assert not shipped.calibrate and shipped.calibration
    assert ("rates: as measured on all-MiniLM-L6-v2, not on SmolLM2-135M-Instruct (the default: on MPNet-base and "
            "SmolLM2-135M") in line
    assert line.endswith("--rates calibrated or transfer fit them to this model")
    calibrated, line = for_search("auto", "SmolLM2-135M-Instruct", "default", rates="calibrated")
    assert calibrated.calibrate and "times this study's LoRA rate" in line
    with pytest.raises(UserError, match="--rates must be one of absolute, calibrated, transfer"):
        for_search("auto", "SmolLM2-135M-Instruct", "default", rates="auto")


def test_calibrating_a_portfolio_without_a_calibration_is_one_line(tmp_path):
    path = str(_portfolio(tmp_path / "p.json", calibration=None, model="my-model"))
    with pytest.raises(UserError, match="records no LoRA rates to calibrate against.*--rates absolute"):
        for_search(path, "my-model", "default", rates="calibrated")
    assert not load(path).calibration


@pytest.mark.parametrize("entry", [{"baseline": "adapter", "rates": {"a": 1e-3}}, {"baseline": "lora"},
                                   {"baseline": "lora", "rates": {"a": -1}}, ["lora"]])
def test_a_malformed_calibration_is_one_line(tmp_path, entry):
    path = _portfolio(tmp_path / "p.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "calibration": entry}))
    with pytest.raises(UserError, match="calibration must be"):
        load(path)


def test_a_calibrated_study_sweeps_lora_first_and_holds_its_members_until_loras_rate_is_known(tmp_path):
    study, control = _study(tmp_path, "held", _portfolio(tmp_path / "p.json"), baselines=True, rates="calibrated")
    assert control.plan.baselines == ["lora", "unipelt_apl"]
    lora = control.next_trial()
    assert study.get_trials(deepcopy=False)[0].user_attrs["baseline"] == "lora" and lora.settings.learning_rate is None
    unipelt = control.next_trial()  # queued before the members; LoRA's rate unknown yet: it sweeps its own
    assert unipelt.settings.learning_rate is None
    assert control.next_trial() == WAIT  # no worker draws ahead of the held members
    assert not any(t.user_attrs.get("portfolio") for t in study.get_trials(deepcopy=False))


def test_a_calibrated_studys_members_train_at_their_rate_times_loras_over_the_reference(tmp_path):
    study, control = _study(tmp_path, "calibrated", _portfolio(tmp_path / "p.json"), budget=10, baselines=True,
                            rates="calibrated")
    fakes.run_serially(control)
    records = read_all(study)
    lora = next(r for r in records if r.baseline == "lora")
    assert lora.number == 0 and lora.lr_choice["how"] == "sweep" and lora.learning_rate == fakes.SWEPT_RATE
    factor = fakes.SWEPT_RATE / 2e-3
    members = {r.portfolio["name"]: r for r in records if r.portfolio and r.is_answer}
    assert set(members) == set(MEMBERS)
    for name, member in members.items():
        assert math.isclose(member.learning_rate, BY_NAME[name].learning_rate * factor)
        assert member.lr_from["how"] == "calibrated" and math.isclose(member.lr_from["calibration"], fakes.SWEPT_RATE)
    unipelt = next(r for r in records if r.baseline == "unipelt_apl")  # asked after LoRA finished: its learned rate,
    assert math.isclose(unipelt.learning_rate, 1e-3 * factor)  # calibrated like the members'


def test_a_study_on_the_portfolios_own_model_keeps_its_rates_and_runs_no_calibration(tmp_path):
    study, control = _study(tmp_path, "same", _portfolio(tmp_path / "p.json"), baselines=True)
    assert control.plan.baselines == ["unipelt_apl"] and not control.plan.portfolio.calibrate
    fakes.run_serially(control)
    members = [r for r in read_all(study) if r.portfolio and r.is_answer]
    assert sorted(r.learning_rate for r in members) == sorted(BY_NAME[m].learning_rate for m in MEMBERS)


def test_a_portfolio_built_from_calibrated_studies_records_their_lora_rates(tmp_path):
    portfolio = _portfolio(tmp_path / "p.json")
    for name in ("task-a", "task-b"):
        study, control = _study(tmp_path, name, portfolio, budget=10, baselines=True, rates="calibrated")
        fakes.run_serially(control)
    data = build.from_studies(f"sqlite:///{tmp_path}/study.db", None, 2, str(tmp_path / "mine.json"))
    assert data["calibration"] == {"baseline": "lora", "rates": {"task-a": fakes.SWEPT_RATE,
                                                                 "task-b": fakes.SWEPT_RATE}}
    assert load(tmp_path / "mine.json").calibration == {"task-a": fakes.SWEPT_RATE, "task-b": fakes.SWEPT_RATE}


def test_the_header_says_lora_sweeps_as_the_calibration(tmp_path):
    from autopelt.search.view import _baseline_rates

    study, control = _study(tmp_path, "said", _portfolio(tmp_path / "p.json"), baselines=True, rates="calibrated")
    said = _baseline_rates(control.plan, control.plan.baselines)
    assert said.startswith("lora sweeps its learning rate") and "calibrated like its members" in said


def test_transferred_rates_scale_every_member_and_baseline_by_the_hidden_sizes():
    shipped, _ = for_search("auto", "SmolLM2-135M-Instruct", "default")
    moved, line = for_search("auto", "SmolLM2-135M-Instruct", "default", rates="transfer", hidden_size=576)
    scale = (384 / 576) ** 0.781
    assert moved.transfer == pytest.approx(scale) and moved.members == shipped.members  # recorded rates kept
    for member in moved.members:  # what the policy trains them at
        assert portfolio_rate(moved, member.learning_rate, None)[0] == pytest.approx(member.learning_rate * scale,
                                                                                      rel=2e-3)
    learned = moved.baseline_rates["unipelt_apl"]
    assert portfolio_rate(moved, learned, None)[0] == pytest.approx(learned * scale, rel=2e-3)
    assert not moved.calibrate and f"= {scale:.2f}" in line and "rates: transfer: members and learned baseline rates train at" in line
    with pytest.raises(UserError, match="--rates transfer needs the hidden size"):
        for_search("auto", "SmolLM2-135M-Instruct", "default", rates="transfer")
