"""What draws after the portfolio (`--sampler`, search/leaders.py): the portfolio alone, and its leaders again at
other rates before TPE; driven with the stand-in trial (support/fakes.py: a trial's dev grows with its rate)."""

from __future__ import annotations

import pytest
from support import fakes
from test_portfolio import _small_portfolio, _study

from autopelt.errors import UserError
from autopelt.search.plan import prepare
from autopelt.search.view import _portfolio_plan
from autopelt.study.record import read_all
from test_search_controller import search_options


def _phases(study) -> list[str]:
    return [r.phase for r in read_all(study)]


def test_the_portfolio_alone_takes_the_samplers_share_and_then_its_finalists(tmp_path):
    study, control = _study(tmp_path, "alone", _small_portfolio(tmp_path / "p.json"), budget=8, sampler="none")
    assert control.plan.portfolio_size == 3  # all of them: 8 trials hold 3 members and 2 finalists
    ran = fakes.run_serially(control)
    phases = _phases(study)
    assert ran == 5 and "searched" not in phases
    assert phases[:3] == ["portfolio #1", "portfolio #2", "portfolio #3"]
    assert all(p.endswith("again") for p in phases[3:])


def test_on_a_trial_budget_the_portfolio_alone_runs_every_member_the_budget_holds(tmp_path):
    plan = prepare(search_options(tmp_path, budget=20, sampler="none", portfolio="auto", baselines=True,
                                  space="default"))
    today = prepare(search_options(tmp_path, budget=20, portfolio="auto", baselines=True, space="default"))
    assert (len(plan.baselines), plan.finalists) == (1, 3)
    assert plan.portfolio_size == 16 and today.portfolio_size == 9  # 20 = 1 + 16 + 3; today 7 are drawn
    assert _portfolio_plan(plan).endswith("trains to the end)")
    assert _portfolio_plan(today).endswith(", then the sampler")


def test_the_leaders_train_again_at_half_and_twice_their_rate_before_the_sampler_draws(tmp_path):
    study, control = _study(tmp_path, "leaders", _small_portfolio(tmp_path / "p.json"), budget=12,
                            sampler="leaders")
    tickets = []
    fakes.run_serially(control, lambda settings, report: tickets.append(settings) or fakes.fake_trial(settings,
                                                                                                       report))
    phases = _phases(study)
    assert phases[:7] == ["portfolio #1", "portfolio #2", "portfolio #3", "portfolio #1 ×0.5 lr",
                          "portfolio #1 ×2 lr", "portfolio #2 ×0.5 lr", "portfolio #2 ×2 lr"]
    # the members' rates are 3e-3, 2e-3, 1e-3 and the stand-in's dev grows with the rate: #1, #2 lead
    assert [s.learning_rate for s in tickets[3:7]] == pytest.approx([1.5e-3, 6e-3, 1e-3, 4e-3])
    assert phases[7:9] == ["searched", "searched"]  # 12 = 3 members + 4 variants + 2 drawn + 3 finalists
    assert len(phases) == 12 and all(p.endswith("again") for p in phases[9:])
    # the best of all, a variant at twice the first member's rate, is a finalist and may answer
    assert any("#4 again" in p or "#5 again" in p for p in phases[9:])


def _concurrently(control, width: int) -> None:
    """Run the search with `width` trials in flight (as many workers), the oldest finishing first."""
    running = []
    while True:
        while len(running) < width and not isinstance(ticket := control.next_trial(), str):
            running.append(ticket)
        if not running:
            return
        done = running.pop(0)
        control.finish(done.number, fakes.fake_trial(done.settings, lambda e: control.report(done.number, e)))


@pytest.mark.parametrize("width", [2, 4])
def test_with_several_workers_no_draw_comes_before_the_leaders_variants(tmp_path, width):
    """While the last members run, a free worker waits: a draw then would take a variant's place in the budget."""
    study, control = _study(tmp_path, f"w{width}", _small_portfolio(tmp_path / "p.json"), budget=10,
                            sampler="leaders")
    _concurrently(control, width)
    phases = _phases(study)
    variants = [i for i, p in enumerate(phases) if "×" in p]
    searched = [i for i, p in enumerate(phases) if p == "searched"]
    assert len(variants) == 4 and all(i > max(variants) for i in searched), phases


def test_the_default_budget_on_four_workers_holds_every_variant(tmp_path):
    fakes.script(tmp_path / "out")
    plan = prepare(search_options(tmp_path, budget=20, sampler="leaders", portfolio="auto", baselines=True,
                                  space="default", workers=4))
    from autopelt.search.controller import Controller
    from autopelt.search.resume import open_study

    study = open_study(plan)
    control = Controller(study, plan)
    control.start()
    _concurrently(control, 4)
    assert sum("×" in p for p in _phases(study)) == 4


def test_a_leaders_variant_trains_to_the_end(tmp_path):
    study, control = _study(tmp_path, "end", _small_portfolio(tmp_path / "p.json"), budget=12, sampler="leaders")
    fakes.run_serially(control, stop_after=3)
    variant = control.next_trial()
    assert variant.settings.learning_rate == pytest.approx(1.5e-3) and not variant.stoppable


@pytest.mark.parametrize("sampler", ["none", "leaders"])
def test_without_a_portfolio_the_portfolio_samplers_are_one_line(tmp_path, sampler):
    with pytest.raises(UserError, match=f"--sampler {sampler} works on a portfolio's members"):
        prepare(search_options(tmp_path, sampler=sampler))


def test_an_unknown_sampler_is_one_line(tmp_path):
    with pytest.raises(UserError, match="--sampler must be one of tpe, random, leaders, none"):
        prepare(search_options(tmp_path, sampler="grid"))


def test_on_a_wall_time_budget_the_portfolio_alone_ends_with_its_finalists_long_before_the_deadline(tmp_path):
    study, control = _study(tmp_path, "timed", _small_portfolio(tmp_path / "p.json"), budget="10m", sampler="none")
    fakes.script(tmp_path / "out" / "timed", seconds_per_epoch=0.01)  # a trial measures its time
    fakes.run_serially(control)
    phases = _phases(study)
    assert phases[:3] == ["portfolio #1", "portfolio #2", "portfolio #3"] and "searched" not in phases
    assert len(phases) > 3 and all(p.endswith("again") for p in phases[3:])
    assert control.time_left() > 500  # nothing was drawn to fill the ten minutes
