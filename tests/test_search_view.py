"""The study summary's cost line: counts in words that agree with them, and no sweep time where none was swept."""

from __future__ import annotations

from types import SimpleNamespace

from autopelt.search.summary import baseline_cost


def trial(baseline=None, seconds=10.0, finalist_of=None, sweep=0.0, portfolio=None):
    return SimpleNamespace(baseline=baseline, seconds=seconds, finalist_of=finalist_of or {},
                           lr_choice={"seconds": sweep} if sweep else {}, portfolio=portfolio or {})


def test_the_portfolios_trials_are_counted_apart_from_the_samplers():
    member = {"name": "lora-r8", "rank": 0}
    line = baseline_cost([trial("unipelt_apl", 60.0), trial(seconds=30.0, portfolio=member),
                          trial(seconds=30.0, portfolio=member), trial(seconds=20.0, finalist_of={"trial": 1})])
    assert "· portfolio: 2 trials, 1m00s · searched: none · finalists again: 1 trial, 20s" in line
    drawn = baseline_cost([trial(seconds=30.0, portfolio=member), trial(seconds=15.0)])
    assert drawn.endswith("· portfolio: 1 trial, 30s · searched: 1 trial, 15s")


def test_one_baseline_at_a_learned_rate_is_one_trial_and_no_sweep():
    line = baseline_cost([trial("unipelt_apl", 50.0), trial(seconds=30.0), trial(seconds=20.0, finalist_of={"trial": 1})])
    assert line.startswith("baselines: 1 trial, 50s (50% of the trial time) · searched: 1 trial, 30s")
    assert line.endswith("finalists again: 1 trial, 20s") and "choosing" not in line


def test_swept_baselines_say_what_the_sweeps_cost():
    line = baseline_cost([trial("lora", 40.0, sweep=12.0), trial("adapter", 40.0, sweep=8.0), trial(seconds=20.0)])
    assert line == "baselines: 2 trials, 1m20s (80% of the trial time; 20s of it choosing learning rates) · " \
                   "searched: 1 trial, 20s"


def test_the_eta_counts_the_epochs_of_the_first_trial_before_it_ends(monkeypatch):
    from autopelt.search import view
    from autopelt.search.budget import TrialBudget

    study = SimpleNamespace(get_trials=lambda deepcopy=False: [])
    live = view.LiveView(study, SimpleNamespace(budget=TrialBudget(4)), echo=lambda line: None)
    assert live._eta(10.0) == "?"
    monkeypatch.setattr(view.LiveView, "_line", lambda self, *args: None)
    live.on_progress(0, 1, 2, 0.7)  # half of the first trial in 10 s: 3.5 trials left at 20 s a trial
    assert live._eta(10.0) == "1m10s"


def test_a_rate_is_said_swept_only_where_the_trial_swept_rates():
    from autopelt.search.trial_text import rate_text

    swept = SimpleNamespace(learning_rate=3e-3, lr_choice={"how": "sweep", "candidates": {"1e-3": {}, "3e-3": {}}})
    given = SimpleNamespace(learning_rate=3e-3, lr_choice={"how": "given"})
    assert rate_text(swept) == ", lr 0.003, chosen by a sweep of 2" and rate_text(given) == ", lr 0.003"
