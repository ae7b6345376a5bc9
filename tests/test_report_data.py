"""The report's numbers, on a synthetic study in a temporary SQLite file (tests/support/example_study.py).

Trials of the study (see example_study's docstring for the core ones):
  #0..5 baselines (unipelt_apl gated), #6 #9 #10 searched COMPLETE (#9 gated, the best), #7 PRUNED at 1/3,
  #8 FAIL (out of memory), #11 FAIL (over budget), #12 WAITING, and added here:
  #13 COMPLETE but not at full fidelity, better than everything (must count nowhere),
  #14 baseline `prompt` FAIL, #15 baseline `lora` again, interrupted (FAIL).
"""

from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")

from optuna.trial import TrialState, create_trial  # noqa: E402

from support import example_study as example  # noqa: E402
from autopelt.report.contents import collect, protocol_text  # noqa: E402
from autopelt.report.data import baseline_comparison, gate_maps, history, pareto, top_trials  # noqa: E402
from autopelt.report.importance import param_importances  # noqa: E402
from autopelt.study.answers import best as best_trial  # noqa: E402
from autopelt.study.record import gate_table, read_all  # noqa: E402

ANSWERS = [9, 0, 6, 1, 3, 10, 4, 2, 5]  # the answer trials, best first


def build_study(url: str, multi_objective: bool = False) -> optuna.Study:
    study = example.build(url, multi_objective=multi_objective)
    values = [0.75, 0.01] if multi_objective else [0.75]
    study.add_trial(create_trial(values=values, params={"lora.rank": 1, "learning_rate": 1e-3},
                                 distributions={"lora.rank": example.RANK, "learning_rate": example.LEARNING_RATE},
                                 user_attrs=example.attrs("lora r1 (partial)", ["lora"], 0.01, 0.75, fidelity=2,
                                                          gates=example.gates(13))))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=example.attrs(
        "prompt L20", ["prompt"], 0.02, None, fidelity=0, baseline="prompt", fail_reason="dev metric is nan")))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs=example.attrs(
        "lora r8 q,v", ["lora"], 0.25, None, fidelity=1, baseline="lora", fail_reason="interrupted")))
    return study


@pytest.fixture(scope="module", params=[False, True], ids=["single-objective", "multi-objective"])
def trials(request, tmp_path_factory):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path_factory.mktemp('study') / 'study.db'}"
    build_study(url, multi_objective=request.param)
    # read back from the database, as the report does
    return read_all(optuna.load_study(study_name=example.STUDY, storage=url))


def test_history_lists_finished_trials_with_the_best_answer_so_far(trials):
    points = history(trials)
    assert [p.number for p in points] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15]  # #12 waits
    assert [p.best_so_far for p in points] == [0.70] * 9 + [0.72] * 6  # #13's 0.75 is not full fidelity
    assert [p.state for p in points if not p.answer] == ["PRUNED", "FAIL", "FAIL", "COMPLETE", "FAIL", "FAIL"]
    by_number = {p.number: p for p in points}
    assert by_number[7].value == 0.52 and by_number[7].note == "stopped early at epoch 1/3"
    assert by_number[8].value is None and "CUDA out of memory" in by_number[8].note
    assert by_number[13].note == "not full fidelity (2/3)"
    assert by_number[0].baseline == "unipelt_apl" and by_number[6].baseline is None


def test_best_so_far_is_monotone_and_equals_the_running_best():
    study = optuna.create_study()
    for number, value in enumerate([0.3, 0.5, 0.4, 0.8, 0.1, 0.9]):
        study.add_trial(create_trial(value=value, user_attrs={"full_fidelity": number != 5}))
    assert [p.best_so_far for p in history(read_all(study))] == [0.3, 0.5, 0.5, 0.8, 0.8, 0.8]
    assert [p.best_so_far for p in history(read_all(study), maximize=False)] == [0.3, 0.3, 0.3, 0.3, 0.1, 0.1]


def test_pareto_front_holds_exactly_the_non_dominated_answer_trials(trials):
    front = pareto(trials)
    assert [p.number for p in front.front] == [4, 10, 3, 6, 9]  # by params % ascending
    assert [p.params_pct for p in front.front] == [0.05, 0.10, 0.25, 0.30, 0.40]
    assert [p.number for p in front.dominated] == [0, 1, 2, 5]
    # the pruned #7 (0.52 at 0.02%) and the partial #13 (0.75 at 0.01%) would be on it: they count nowhere
    assert {7, 13}.isdisjoint(p.number for p in front.front + front.dominated)


def test_pareto_front_follows_the_metric_direction(trials):
    assert [p.number for p in pareto(trials, maximize=False).front] == [4, 5]  # lowest dev, fewest params


def test_pareto_keeps_equal_points_together():
    study = optuna.create_study()
    for dev, pct in [(0.7, 1.0), (0.7, 1.0), (0.7, 2.0), (0.6, 0.5)]:
        study.add_trial(create_trial(value=dev, user_attrs={"full_fidelity": True, "params_pct": pct}))
    front = pareto(read_all(study))
    assert [p.number for p in front.front] == [3, 0, 1]  # equal points do not dominate each other
    assert [p.number for p in front.dominated] == [2]


def test_search_against_each_baseline(trials):
    comparison = baseline_comparison(trials, "accuracy")
    assert comparison.searched.number == 9 and comparison.searched.dev == 0.72
    assert comparison.searched.test == 0.71 and comparison.searched.params_pct == 0.40
    rows = {row.name: row for row in comparison.baselines}
    assert list(rows) == ["unipelt_apl", "adapter", "prefix", "lora", "compacter", "bitfit", "prompt"]
    expected = {"unipelt_apl": -0.02, "adapter": -0.06, "prefix": -0.12, "lora": -0.08, "compacter": -0.10,
                "bitfit": -0.14}
    for name, difference in expected.items():
        assert rows[name].vs_searched == pytest.approx(difference)
        assert rows[name].state == "COMPLETE"
    assert rows["lora"].number == 3  # its completed run, not the later interrupted one (#15)
    assert rows["prompt"].state == "FAIL" and rows["prompt"].dev is None and rows["prompt"].vs_searched is None
    assert rows["prompt"].note == "dev metric is nan"


def test_top_trials_and_best_trial(trials):
    assert [row.number for row in top_trials(trials, "accuracy", limit=20)] == ANSWERS
    assert [row.number for row in top_trials(trials, "accuracy", limit=3)] == ANSWERS[:3]
    assert best_trial(trials).number == 9


def test_best_trial_breaks_ties_by_size_then_number():
    study = optuna.create_study()
    for pct in [0.5, 0.2, 0.2]:
        study.add_trial(create_trial(value=0.8, user_attrs={"full_fidelity": True, "params_pct": pct}))
    assert best_trial(read_all(study)).number == 1
    assert [row.number for row in top_trials(read_all(study), "accuracy")] == [1, 2, 0]


def test_gate_maps_best_gated_searched_trial_then_gated_baselines(trials):
    maps = gate_maps(trials)
    assert [(m.number, m.baseline) for m in maps] == [(9, None), (0, "unipelt_apl")]  # not the partial #13
    for gate_map, seed in zip(maps, [9, 0]):
        stored = example.gates(seed)
        assert gate_map.kinds == ["adapter", "prefix", "lora"] and gate_map.layers == list(range(example.LAYERS))
        assert gate_map.values == [[stored[kind][str(layer)] for layer in range(6)] for kind in gate_map.kinds]


def test_gate_table_reads_both_stored_forms_and_skips_junk():
    assert gate_table({"lora": {"1": 0.5, "0": 0.25}, "prefix": [0.1, 0.2]}) == {
        "lora": {0: 0.25, 1: 0.5}, "prefix": {0: 0.1, 1: 0.2}}
    assert gate_table({"lora": {"x": 0.5, "2": None}, "adapter": {"3": float("nan")}}) == {}
    assert gate_table(None) == {} and gate_table("gates") == {}


def test_gate_map_leaves_holes_where_a_kind_has_no_gate():
    study = optuna.create_study()
    study.add_trial(create_trial(value=0.7, user_attrs={
        "full_fidelity": True, "gates": {"lora": {"0": 0.2, "2": 0.4}, "adapter": {"1": 0.9}}}))
    (gate_map,) = gate_maps(read_all(study))
    assert gate_map.kinds == ["adapter", "lora"] and gate_map.layers == [0, 1, 2]
    assert gate_map.values == [[None, 0.9, None], [0.2, None, 0.4]]


def test_importances_use_searched_answer_trials_with_parameters(trials):
    importances = param_importances(trials)
    assert importances.trials == 3 and importances.note is None  # #6, #9, #10 (not the partial #13)
    assert set(importances.values) == {"lora.rank", "learning_rate", "adapter.bottleneck", "prefix.length"}
    assert sum(importances.values.values()) == pytest.approx(1.0)
    assert list(importances.values.values()) == sorted(importances.values.values(), reverse=True)


def test_importances_say_why_when_there_are_too_few_trials(trials):
    too_few = param_importances([t for t in trials if t.number in (0, 1, 2, 6, 7)])  # baselines: no params
    assert too_few.values == {} and too_few.trials == 1
    assert too_few.note == "not enough trials: 1 complete full-fidelity searched trial(s) with parameters, 2 needed"


def test_importances_find_the_parameter_that_decides_the_metric():
    study = optuna.create_study()
    x_range = optuna.distributions.FloatDistribution(0, 1)
    for i in range(30):
        x, noise = i / 29, (i * 7 % 30) / 29  # noise: a scrambled copy of the grid
        study.add_trial(create_trial(value=x, params={"x": x, "noise": noise},
                                     distributions={"x": x_range, "noise": x_range},
                                     user_attrs={"full_fidelity": True}))
    values = param_importances(read_all(study)).values
    assert list(values) == ["x", "noise"] and values["x"] > 0.8


def test_pruned_value_is_the_last_reported_one_in_both_study_kinds(trials):
    (pruned,) = [t for t in trials if t.number == 7]
    assert pruned.dev_value == 0.52


def test_header_counts_states_and_names_the_best_trial(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    contents = collect(build_study(f"sqlite:///{tmp_path / 's.db'}"))
    header = contents.header
    assert header.states == {"COMPLETE": 10, "PRUNED": 1, "FAIL": 4, "WAITING": 1}
    assert header.answers == 9 and header.best.number == 9 and header.best.dev == 0.72
    assert (header.task, header.space, header.metric, header.maximize) == ("rte", "unipelt", "accuracy", True)
    assert header.protocol == "k-shot (k=1000)"
    assert header.best_hparams == {"learning_rate": 5e-4, "epochs": 3}
    assert header.best_spec == {"methods": [{"method": "adapter"}, {"method": "prefix"}, {"method": "lora"}]}
    assert dict(header.fail_reasons) == {"CUDA out of memory. Tried to allocate 2.00 GiB": 1,
                                         "over parameter budget: 5.0% > 1%": 1, "dev metric is nan": 1,
                                         "interrupted": 1}
    assert [row.number for row in contents.top] == ANSWERS


def test_an_empty_study_has_nothing_to_show():
    contents = collect(optuna.create_study(study_name="empty"))
    assert contents.history == [] and contents.pareto.front == [] and contents.gates == [] and contents.top == []
    assert contents.header.best is None and contents.header.states == {} and contents.importances.note
    assert contents.header.metric == "dev metric" and contents.header.task == "?"


def test_protocol_text():
    assert protocol_text({"name": "full"}) == "full"
    assert protocol_text({"name": "k-shot", "k": 100}) == "k-shot (k=100)"
    assert protocol_text(None) == "?" and protocol_text("full") == "full"


def test_finalists_rank_first_by_their_mean_dev_and_show_it():
    from autopelt.study import answers
    from autopelt.study.record import TrialRecord

    def trial(number, dev, **fields):
        return TrialRecord(number=number, state=TrialState.COMPLETE, values=(dev,), full_fidelity=True,
                           params_pct=0.3, summary=f"delta {number}", **fields)

    # #0 and #1 were trained again (#3, #4); #2, better on its one seed, was not
    records = [trial(0, 0.90), trial(1, 0.80), trial(2, 0.88), trial(3, 0.60, finalist_of={"trial": 0, "seed": 1000}),
               trial(4, 0.84, finalist_of={"trial": 1, "seed": 1000})]
    assert answers.seed_devs(records) == {0: [0.90, 0.60], 1: [0.80, 0.84]}
    assert [r.number for r in answers.ranked(records)] == [1, 0, 2]  # a re-run is never an answer itself
    rows = top_trials(records, "accuracy")
    assert [(r.number, round(r.dev, 4)) for r in rows] == [(1, 0.82), (0, 0.75), (2, 0.88)]
    assert rows[0].note.startswith("finalist: mean dev of 2 seeds (0.8000, 0.8400)") and "finalist" not in rows[2].note
