"""A resumed study restores its plan: the baseline and the portfolio members that failed run again before the
sampler, the summary shows the trial that replaced a failure, and a study nothing answers suggests no export.
On the controller and the synthetic objective of tests/support/fakes.py (no training)."""

from __future__ import annotations

from optuna.trial import TrialState
from support import fakes
from test_portfolio import _small_portfolio, _study

from autopelt.search import recorder as recorder_module
from autopelt.search.summary import summary_lines
from autopelt.study import answers
from autopelt.study.record import read_all


def wrong_data_dir(settings, report):
    raise FileNotFoundError("no folder /wrong/sst2 for task 'sst2'")  # what every trial met with a wrong --data-dir


def test_a_study_whose_first_run_failed_answers_as_an_uninterrupted_one(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_module, "MAX_FAILURES_IN_ROW", 4)
    portfolio = _small_portfolio(tmp_path / "p.json")
    options = {"baselines": True, "finalists": 0, "budget": 2}  # UniPELT(APL) and the portfolio's first

    study, failing = _study(tmp_path, "resumed", portfolio, **options)
    fakes.run_serially(failing, wrong_data_dir)
    assert failing.recorder.error and all(t.state == TrialState.FAIL for t in study.trials)
    lines = summary_lines(study, failing.plan, 1.0)
    assert "best: no trial completed yet" in lines
    assert not any("autopelt export" in line for line in lines)  # nothing to export
    assert any("autopelt report" in line for line in lines)

    study, resumed = _study(tmp_path, "resumed", portfolio, **options)  # the same command, the cause fixed
    assert fakes.run_serially(resumed) == 2
    study_fresh, fresh = _study(tmp_path, "fresh", portfolio, **options)
    assert fakes.run_serially(fresh) == 2

    def trained(s):
        return [(r.baseline, r.portfolio.get("name"), r.learning_rate, r.values) for r in read_all(s)
                if r.state == TrialState.COMPLETE]

    assert trained(study) == trained(study_fresh) and len(trained(study)) == 2
    best, best_fresh = answers.best(read_all(study)), answers.best(read_all(study_fresh))
    assert best.portfolio.get("name") == best_fresh.portfolio.get("name") == "lora-r8-qv@3e-3"  # the first
    assert best.values == best_fresh.values

    lines = summary_lines(study, resumed.plan, 1.0)
    unipelt = next(line for line in lines if line.strip().startswith("unipelt_apl"))
    assert "FAIL" not in unipelt and "dev accuracy" in unipelt  # the trial that replaced the failure
    assert any("autopelt export" in line for line in lines)


def test_a_baseline_that_trained_is_not_queued_again(tmp_path):
    portfolio = _small_portfolio(tmp_path / "p.json")
    options = {"baselines": True, "finalists": 0, "budget": 2}
    study, control = _study(tmp_path, "s", portfolio, **options)
    fakes.run_serially(control)
    study, again = _study(tmp_path, "s", portfolio, **options)
    assert fakes.run_serially(again) == 0 and len(study.trials) == 2
