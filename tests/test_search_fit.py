"""Budgets honour the plan: a wall-time budget too short for the portfolio's first configuration is refused before
any trial, with the time it needs; one that holds it but not the baseline too runs it alone and says so; a trial
budget names only the portfolio members it runs."""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref

import optuna
import pytest
import torch
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt.cli import main
from autopelt.errors import UserError
from autopelt.search import budget_fit
from autopelt.search.plan import SearchOptions, prepare
from autopelt.search.view import _portfolio_plan

optuna.logging.set_verbosity(optuna.logging.WARNING)


def pinned_portfolio(tmp_path, model):
    """A portfolio whose first member trains at batch 16 (the shipped one's first depends on the task's prior), with
    the shipped one's learned UniPELT rate: the estimates below are then fixed numbers."""
    from autopelt.models import model_name
    from autopelt.portfolio.portfolio import to_file
    from support.configs import BY_NAME

    path = tmp_path / "pinned.json"
    if not path.exists():
        to_file([BY_NAME["lora-r8-qv-ffn-b16@2e-3"], BY_NAME["lora-r8-qv@3e-3"]], model_name(str(model)), {"tasks": []},
                path, {"unipelt_apl": 1e-3})
    return str(path)


def options(tmp_path, sst2_dir, tiny_model_dir, budget, pinned: bool = False, rates: str = "absolute") -> SearchOptions:
    """The shipped portfolio (or a pinned one) at its recorded rates, unless `rates` says otherwise."""
    return SearchOptions(task="sst2", budget=budget, model=str(tiny_model_dir), data_dir=str(sst2_dir),
                         storage=f"sqlite:///{tmp_path}/s.db", out=str(tmp_path / "out"), cpus_per_trial=1,
                         portfolio=pinned_portfolio(tmp_path, tiny_model_dir) if pinned else "auto", rates=rates)


def test_a_budget_a_slow_step_cannot_fill_is_refused_before_any_trial(tmp_path, monkeypatch, capsys, sst2_dir,
                                                                     tiny_model_dir):
    monkeypatch.setattr(budget_fit, "measure_step_seconds", lambda plan, batch, length: 30.0)
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="other", storage=storage)
    capsys.readouterr()
    code = main(["search", "--task", "sst2", "--model", str(tiny_model_dir), "--data-dir", str(sst2_dir),
                 "--budget", "1m", "--storage", storage, "--study-name", "slow",
                 "--portfolio", pinned_portfolio(tmp_path, tiny_model_dir)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    # 58 train rows at the first member's batch of 16: 4 steps an epoch, 3 epochs, and 3 evaluations of the 6 dev
    # rows at a third of a step: 13 steps of 30 s, and a fifth more (loading, tokenising); the baseline as much again
    assert "--budget 1m00s cannot hold the portfolio's first configuration: a trial takes about 7m48s (a measured " \
           "training step: 30 s at batch 16 x" in err[0] and "12 steps); give --budget 16m or more" in err[0], err
    assert "trial" not in captured.out  # nothing ran
    assert optuna.get_all_study_names(storage) == ["other"]


def test_a_budget_that_holds_the_portfolios_first_alone_runs_it_alone_and_says_so(tmp_path, monkeypatch, sst2_dir,
                                                                                 tiny_model_dir):
    monkeypatch.setattr(budget_fit, "measure_step_seconds", lambda plan, batch, length: 3.0)  # 13 x 3 x 1.2: a trial of 47 s
    plan = prepare(options(tmp_path, sst2_dir, tiny_model_dir, "1m", pinned=True))
    assert plan.baselines == ["unipelt_apl"] and plan.portfolio is not None
    fitted = budget_fit.fit_time_budget(plan)
    assert fitted.baselines == []
    assert fitted.fit_note.startswith("budget 1m00s: the portfolio's first configuration alone (about 47s, a measured "
                                      "training step"), fitted.fit_note
    assert fitted.fit_note.endswith("--budget 2m runs unipelt_apl too")
    assert budget_fit.fit_time_budget(prepare(options(tmp_path, sst2_dir, tiny_model_dir, "2m", pinned=True))).baselines == [
        "unipelt_apl"]


def test_a_budget_with_no_room_for_the_baselines_drops_the_calibration_with_them(tmp_path, monkeypatch, sst2_dir,
                                                                                    tiny_model_dir):
    monkeypatch.setattr(budget_fit, "measure_step_seconds", lambda plan, batch, length: 3.0)
    plan = prepare(options(tmp_path, sst2_dir, tiny_model_dir, "1m", rates="calibrated"))  # the shipped one, calibrated
    assert plan.portfolio.calibrate and plan.baselines == ["lora", "unipelt_apl"]
    fitted = budget_fit.fit_time_budget(plan)
    assert fitted.baselines == [] and not fitted.portfolio.calibrate
    assert fitted.fit_note.endswith("the portfolio's rates as measured on all-MiniLM-L6-v2 (no time for LoRA's "
                                    "calibration)"), fitted.fit_note


def test_a_step_is_measured_on_the_model_itself(tmp_path, sst2_dir, tiny_model_dir):
    plan = prepare(options(tmp_path, sst2_dir, tiny_model_dir, "1h"))
    estimate = budget_fit.estimate_trial(plan)
    assert math.isfinite(estimate.seconds) and 0 < estimate.seconds < 60
    assert estimate.how.startswith("a measured training step: ")


def timed_linears(plan, batch: int, length: int, seen: list, fail: bool = False) -> float:
    """The budget check's step, watched through torch's global forward hook: each plain linear it ran (a weak
    reference) and its output's dtype, into `seen`; `fail` raises CUDA's out-of-memory error from the first one."""

    def watch(module, args, output):
        if isinstance(module, torch.nn.Linear):
            seen.append((weakref.ref(module), output.dtype))
            if fail:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB\nmore detail")

    handle = torch.nn.modules.module.register_module_forward_hook(watch)
    try:
        return budget_fit.measure_step_seconds(plan, batch, length)
    finally:
        handle.remove()


@pytest.mark.parametrize("precision, computed", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_the_budget_check_times_the_step_in_the_trials_precision_and_keeps_nothing(tmp_path, sst2_dir, tiny_model_dir,
                                                                                    precision, computed):
    asked = dataclasses.replace(options(tmp_path, sst2_dir, tiny_model_dir, "1h"), precision=precision)
    seen = []
    seconds = timed_linears(prepare(asked), 4, 16, seen)
    assert seconds > 0 and seen and {dtype for _, dtype in seen} == {computed}  # bf16: autocast, as a trial
    gc.collect()
    assert all(ref() is None for ref, _ in seen)  # the model is gone before the trials start


def test_a_budget_check_that_runs_out_of_memory_says_so_in_one_line_and_lets_go(tmp_path, sst2_dir, tiny_model_dir):
    plan = prepare(options(tmp_path, sst2_dir, tiny_model_dir, "1h"))
    seen = []
    with pytest.raises(UserError) as error:
        timed_linears(plan, 4, 16, seen, fail=True)
    assert str(error.value) == ("the budget check's training step at batch 4 x 16 tokens: out of memory: CUDA out of "
                                "memory. Tried to allocate 9.00 GiB (lower --batch-size or --max-length, or run fewer "
                                "--workers at once)")
    del error
    gc.collect()
    assert len(seen) == 1 and seen[0][0]() is None


def test_a_trial_budget_names_only_the_portfolio_members_it_runs(tmp_path, sst2_dir, tiny_model_dir):
    one = prepare(options(tmp_path, sst2_dir, tiny_model_dir, 1))
    assert one.baselines == [] and one.portfolio_size == 1
    assert _portfolio_plan(one) == "the portfolio's first configuration"
    two = prepare(options(tmp_path, sst2_dir, tiny_model_dir, 2))
    assert _portfolio_plan(two) == "1 baseline(s), then the portfolio's first configuration"
    twenty = prepare(options(tmp_path, sst2_dir, tiny_model_dir, 20))
    assert _portfolio_plan(twenty).startswith("1 baseline(s), then the portfolio's first 9 configurations")
    assert _portfolio_plan(twenty).endswith(", then the sampler")


def test_a_calibrated_portfolio_gives_loras_sweep_a_trial_of_the_budget_and_none_at_one(tmp_path, sst2_dir,
                                                                                      tiny_model_dir):
    calibrated = prepare(options(tmp_path, sst2_dir, tiny_model_dir, 20, rates="calibrated"))  # the shipped one
    assert calibrated.portfolio.calibrate and calibrated.baselines == ["lora", "unipelt_apl"]
    assert _portfolio_plan(calibrated).startswith("2 baseline(s), then the portfolio's first 8 configurations")
    two = prepare(options(tmp_path, sst2_dir, tiny_model_dir, 2, rates="calibrated"))
    assert two.baselines == ["lora"] and two.portfolio_size == 1 and two.portfolio.calibrate
    one = prepare(options(tmp_path, sst2_dir, tiny_model_dir, 1, rates="calibrated"))
    assert one.baselines == [] and not one.portfolio.calibrate
    assert "rates: absolute: measured on all-MiniLM-L6-v2; a budget of one trial has no room" in one.portfolio_note


def test_a_wall_time_budget_promises_the_portfolios_first_and_as_many_more_as_the_time_allows(tmp_path, sst2_dir,
                                                                                           tiny_model_dir):
    plan = prepare(options(tmp_path, sst2_dir, tiny_model_dir, "1h"))
    text = _portfolio_plan(plan)
    assert text.startswith("1 baseline(s), then the portfolio's first configuration (to the end), then as many of "
                           f"its next {plan.portfolio_size - 1} as the time allows")
