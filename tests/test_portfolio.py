"""The portfolio: greedy selection, the leave-one-task-out simulation, portfolio files, and a search that runs
a portfolio first. Uses the controller on the synthetic objective of tests/support/fakes.py (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import fakes
from support.configs import BY_NAME

from autopelt.cli import main as cli
from autopelt.errors import UserError
from autopelt.portfolio import build, select
from autopelt.portfolio.portfolio import SHIPPED, load, to_file
from autopelt.search.controller import Controller
from autopelt.search.plan import prepare
from autopelt.search.resume import open_study
from autopelt.study.record import read_all
from test_search_controller import search_options

ROOT = Path(__file__).resolve().parents[1]


def test_greedy_selection_gives_the_known_order():
    # a is best on average; c covers the task a is worst on; b adds nothing once a and c are in
    scores = {"t1": {"a": 0.90, "b": 0.85, "c": 0.50, "d": 0.70},
              "t2": {"a": 0.80, "b": 0.78, "c": 0.60, "d": 0.70},
              "t3": {"a": 0.40, "b": 0.45, "c": 0.90, "d": 0.60}}
    assert select.greedy_portfolio(scores, 4) == ["a", "c", "b", "d"]
    assert select.mean_regret(scores, ["a", "c"]) == 0.0
    assert select.greedy_portfolio(scores, 1) == ["a"]


def test_task_weights_steer_the_greedy_portfolio():
    scores = {"t1": {"a": 0.90, "b": 0.85, "c": 0.50, "d": 0.70},
              "t2": {"a": 0.80, "b": 0.78, "c": 0.60, "d": 0.70},
              "t3": {"a": 0.40, "b": 0.45, "c": 0.90, "d": 0.60}}
    assert select.greedy_portfolio(scores, 4, dict.fromkeys(scores, 2.0)) == select.greedy_portfolio(scores, 4)
    assert select.greedy_portfolio(scores, 2, {"t1": 0.1, "t2": 0.1, "t3": 1.0}) == ["c", "a"]


def test_regret_is_clipped_and_a_flat_task_adds_none():
    regret = select.normalised_regret({"flat": {"a": 0.5, "b": 0.5}, "wide": {"a": 0.9, "b": 0.1, "c": 0.8}})
    assert regret["flat"] == {"a": 0.0, "b": 0.0}
    assert regret["wide"]["b"] == select.CLIP and regret["wide"]["a"] == 0.0






def _trial(task, config, seed, dev):
    return {"task": task, "config": config, "seed": seed, "status": "ok",
            "epochs": [{"dev": dev, "test": dev, "seconds": 1.0}]}


@pytest.mark.parametrize("change, says", [
    ({"model": "bert-base-uncased"}, "learned on model 'bert-base-uncased'"),
    ({"version": 99}, "format version 99"),
    ({"space": "lora"}, "built for the 'lora' space"),
    ({"format": "something-else"}, "not an autopelt portfolio"),
])
def test_a_mismatched_portfolio_is_one_line_and_the_study_is_untouched(tmp_path, change, says, capsys):
    data = {**json.loads(SHIPPED.read_text()), **change}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=says):
        prepare(search_options(tmp_path, portfolio=str(path), space="default"))
    assert not (tmp_path / "study.db").exists()
    code = cli(["search", "--task", "rte", "--data-dir", str(ROOT.parent / "shared/data/glue"), "--portfolio",
                str(path), "--storage", f"sqlite:///{tmp_path}/cli.db"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says.split("'")[0] in err[0]
    assert not (tmp_path / "cli.db").exists()


def test_a_corrupt_portfolio_file_is_one_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(UserError, match="not a readable portfolio"):
        load(path)


def _small_portfolio(path: Path, baseline_rates: dict | None = None) -> Path:
    members = [BY_NAME["lora-r8-qv@3e-3"], BY_NAME["lora-r8-qv-b16@2e-3"], BY_NAME["pfeiffer-48@1e-3"]]
    to_file(members, "all-MiniLM-L6-v2", {"tasks": ["a", "b"]}, path, baseline_rates)
    return path


def _study(tmp_path, name: str, portfolio: Path, budget: int = 8, **options):
    fakes.script(tmp_path / "out" / name)
    plan = prepare(search_options(tmp_path, portfolio=str(portfolio), budget=budget, study_name=name, **options,
                                  out=str(tmp_path / "out" / name)))
    study = open_study(plan)
    control = Controller(study, plan)
    control.start()
    return study, control


def test_a_search_runs_its_portfolio_first_in_order_at_the_recorded_rates(tmp_path):
    portfolio = _small_portfolio(tmp_path / "p.json")
    study, control = _study(tmp_path, "s", portfolio)
    tickets = [control.next_trial() for _ in range(4)]
    members = [t.settings for t in tickets[:3]]
    assert [s.learning_rate for s in members] == [3e-3, 2e-3, 1e-3]
    assert [s.batch_size for s in members] == [32, 16, 32]
    assert [t.stoppable for t in tickets[:3]] == [False, True, True]  # the first trains to the end
    names = [t.user_attrs.get("portfolio", {}).get("name") for t in study.get_trials(deepcopy=False)[:3]]
    assert names == ["lora-r8-qv@3e-3", "lora-r8-qv-b16@2e-3", "pfeiffer-48@1e-3"]
    assert not tickets[3].settings.spec == members[0].spec or tickets[3].settings.learning_rate != 3e-3


def test_unipelt_trains_at_the_rate_learned_with_the_portfolio_and_sweeps_without_one(tmp_path):
    learned = _small_portfolio(tmp_path / "learned.json", {"unipelt_apl": 1e-3})
    study, control = _study(tmp_path, "learned", learned, baselines=True)
    first = control.next_trial()
    assert study.get_trials(deepcopy=False)[0].user_attrs.get("baseline") == "unipelt_apl"
    assert first.settings.learning_rate == 1e-3
    study, control = _study(tmp_path, "swept", _small_portfolio(tmp_path / "plain.json"), baselines=True)
    assert control.next_trial().settings.learning_rate is None  # the trial sweeps




@pytest.mark.parametrize("rates", [{"unipelt_apl": -1}, {"no_such_baseline": 1e-3}, ["unipelt_apl"]])
def test_a_bad_baseline_rate_in_a_portfolio_file_is_one_line(tmp_path, rates):
    path = _small_portfolio(tmp_path / "p.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "baseline_rates": rates}))
    with pytest.raises(UserError, match="baseline_rates"):
        load(path)


def test_portfolio_build_from_real_studies(tmp_path):
    portfolio = _small_portfolio(tmp_path / "p.json")
    for name in ("task-a", "task-b"):
        study, control = _study(tmp_path, name, portfolio, budget=6)
        fakes.run_serially(control)
        assert sum(bool(r.portfolio) for r in read_all(study)) == 3
    out = tmp_path / "mine.json"
    data = build.from_studies(f"sqlite:///{tmp_path}/study.db", None, 2, str(out))
    assert len(data["members"]) == 2 and data["built_from"]["tasks"] == ["task-a", "task-b"]
    rebuilt = load(out, data["model"])
    for name in ("task-a", "task-b"):  # every member was trained to the end in every study
        import optuna
        trained = {(r.learning_rate, r.hparams.get("batch_size", 32)) for r in read_all(optuna.load_study(
            study_name=name, storage=f"sqlite:///{tmp_path}/study.db")) if r.full_fidelity}
        assert {(m.learning_rate, m.batch_size) for m in rebuilt.members} <= trained


def _record(number: int, dev: float, rank: int | None = None):
    from optuna.trial import TrialState

    from autopelt.study.record import TrialRecord

    return TrialRecord(number=number, state=TrialState.COMPLETE, values=(dev, 1.0), full_fidelity=True,
                       params_pct=1.0, portfolio={"name": "x", "rank": rank} if rank is not None else {})


def test_the_portfolio_favourite_answers_on_a_tie_and_any_higher_dev_beats_it():
    """MARGIN_SE is 0 (docs/portfolio.md: the one-standard-error rule cost on tasks it was not chosen on): the
    favourite wins a tie, even against a smaller delta; any higher dev answers. `beats` keeps the margin."""
    import dataclasses

    from autopelt.study import answers

    favourite = _record(0, 0.800, rank=0)
    tie, close = dataclasses.replace(_record(1, 0.800), params_pct=0.5), _record(2, 0.810)
    assert answers.MARGIN_SE == 0
    assert answers.best([favourite, tie]).number == 0
    assert answers.best([_record(0, 0.800), tie]).number == 1  # no portfolio: the smaller delta wins the tie
    assert answers.best([favourite, tie, close]).number == 2
    # one standard error near 0.8 on 1,000 rows is ~0.018
    assert not answers.beats(0.810, 0.800, margin=1.0) and answers.beats(0.830, 0.800, margin=1.0)
