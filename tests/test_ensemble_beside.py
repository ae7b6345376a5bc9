"""The study's ensemble beside its single answer in a plain `autopelt export` (metrics.json, the model card) and in
`autopelt report`: test_ensemble_export's three finished trials, their dev predictions rewritten so that the
default rule keeps two complementary members (their test predictions are the ones they made as they trained)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import optuna
import pytest
from test_ensemble_export import study_db  # noqa: F401  (three finished trials that kept predictions)
from tinymodels import sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt.cli import main
from autopelt.ensemble.select import accuracy, combine
from autopelt.train.predictions import load, save


def _dev(labels, right_on, sure, unsure):
    """Probabilities that put `sure` on the right class of the rows in `right_on`, `unsure` on the others."""
    out = np.empty((len(labels), 2), dtype=np.float16)
    for row, label in enumerate(labels):
        p = sure if row in right_on else unsure
        out[row, label], out[row, 1 - label] = p, 1 - p
    return out


@pytest.fixture(scope="module")
def pair_study(study_db, tmp_path_factory):  # noqa: F811
    """Trial 0 right on the first 4 dev rows, trial 1 surely right on the last 2: their average is right on all 6;
    trial 2 right on none. The study answers with trial 0 (best dev)."""
    _, root = study_db
    home = tmp_path_factory.mktemp("pair")
    url = f"sqlite:///{home / 'study.db'}"
    study = optuna.create_study(study_name="pair", storage=url, direction="maximize")
    for number, (right_on, sure, unsure) in enumerate([(range(4), 0.9, 0.4), (range(4, 6), 0.95, 0.45),
                                                        ((), 0.0, 0.3)]):
        folder = home / f"trial-{number}"
        shutil.copytree(root / f"trial-{number}", folder)
        kept = load(folder)
        labels = kept["dev_labels"]
        assert len(labels) == 6
        save(folder, {**kept, "dev": _dev(labels, set(right_on), sure, unsure)})
        dev = len(right_on) / 6
        result = json.loads((folder / "result.json").read_text())
        result.update(delta_dir=str(folder / "delta"), dev_metric=dev, dev={"accuracy": dev})
        (folder / "result.json").write_text(json.dumps(result))
        study.add_trial(optuna.trial.create_trial(value=dev, user_attrs={
            "result_dir": str(folder), "full_fidelity": True, "params_pct": result["params"]["stored_pct"],
            "summary": result["summary"]}))
    return url, home


def _expected(home):
    tests = [load(home / f"trial-{i}") for i in (0, 1)]
    labels = tests[0]["test_labels"]
    return accuracy(combine([t["test"] for t in tests], [0.5, 0.5]), labels), accuracy(tests[0]["test"], labels)


def test_a_plain_export_records_the_studys_ensemble_beside_its_answer(pair_study, tmp_path, capsys):
    url, home = pair_study
    out = tmp_path / "best"
    assert main(["export", "--study", "pair", "--storage", url, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    test, single_test = _expected(home)
    assert metrics["trial"] == 0 and metrics["ensemble"] == {
        "members": 2, "forward_passes": 2, "metric": "accuracy", "dev": 1.0, "single_dev": pytest.approx(4 / 6),
        "dev_rows": "the dev rows that chose its members", "test": pytest.approx(test),
        "single_test": pytest.approx(single_test), "answers": True, "margin": 0.0}
    card = (out / "README.md").read_text()
    line = next(line for line in card.splitlines() if "the study's ensemble" in line)
    assert line == (f"- the study's ensemble of 2 deltas (2 forward passes an input): dev accuracy 1.0000 vs this "
                    f"delta's 0.6667 on the dev rows that chose its members; test {test:.4f} vs {single_test:.4f}; "
                    "it answers the study instead of this delta (`autopelt export --ensemble` writes it)")


def test_an_export_of_a_study_whose_ensemble_is_its_answer_alone_says_nothing_of_it(study_db, tmp_path):  # noqa: F811
    url, _ = study_db
    out = tmp_path / "best"
    assert main(["export", "--study", "tiny", "--storage", url, "--out", str(out)]) == 0
    assert "ensemble" not in json.loads((out / "metrics.json").read_text())
    assert "ensemble" not in (out / "README.md").read_text()


def test_the_report_shows_the_ensemble_beside_the_answer_and_says_when_its_test_is_not_scored(pair_study, tmp_path):
    pytest.importorskip("plotly")
    from autopelt.report.contents import collect
    from autopelt.report.page import render

    url, home = pair_study
    study = optuna.load_study(study_name="pair", storage=url)
    view = collect(study).ensemble
    test, single_test = _expected(home)
    assert [weight for _, weight, _ in view.members] == [0.5, 0.5] and view.forward_passes == 2
    assert (view.dev, view.single_dev, view.answers) == (1.0, pytest.approx(4 / 6), True)
    assert (view.test, view.single_test) == (pytest.approx(test), pytest.approx(single_test))
    page = render(collect(study))
    assert ("Ensemble of <b>2</b> trials" in page and "measured on the dev rows that chose its members" in page
            and f"test accuracy <b>{test:.4f}</b> vs the single answer's {single_test:.4f}" in page
            and "2 forward passes an input" in page)
    member = home / "trial-1"  # loses its test predictions: the report computes nothing and says so
    kept = load(member)
    save(member, {name: array for name, array in kept.items() if not name.startswith("test")})
    try:
        unscored = collect(study)
        assert unscored.ensemble.test is None and unscored.ensemble.members == view.members
        assert "test not scored: a member kept no test predictions here" in render(unscored)
        assert "test" not in load(member)
    finally:
        save(member, kept)


def test_the_report_of_a_study_whose_ensemble_is_one_trial_or_none_says_so(study_db, tmp_path):  # noqa: F811
    pytest.importorskip("plotly")
    from autopelt.report.contents import collect
    from autopelt.report.page import ensemble_html, render

    url, _ = study_db
    contents = collect(optuna.load_study(study_name="tiny", storage=url))
    assert len(contents.ensemble.members) == 1 and "kept one member" in render(contents)
    assert "No ensemble: no trial folder here kept dev predictions" in ensemble_html(None, contents.header)
