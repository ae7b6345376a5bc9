"""A search whose trials cannot learn says so: each split's one-class floor beside the answer, one line that
nothing was learned, the same in the report's data and in `export`."""

from __future__ import annotations

import contextlib
import json
import random

import pytest
from tinymodels import tiny_model_dir  # noqa: F401  (a fixture)

from autopelt.cli import main
from autopelt.study.floors import Floors, one_class


def _random_labels(folder, rows: dict[str, int]) -> None:
    """Rows whose label has nothing to do with their text: no delta can learn them. Two thirds are "a"."""
    rng = random.Random(0)
    folder.mkdir(parents=True)
    for split, count in rows.items():
        lines = [json.dumps({"text": " ".join(rng.choice(["x", "y", "z", "w"]) for _ in range(6)),
                             "label": "a" if rng.random() < 2 / 3 else "b"}) for _ in range(count)]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_a_search_that_learns_nothing_says_so_in_the_summary_the_report_and_export(
        tiny_model_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    from support import fakes

    from autopelt.search import ray_backend
    from autopelt.train import run_trial

    _random_labels(tmp_path / "data", {"train": 400, "validation": 150})
    monkeypatch.setattr(ray_backend, "ray_session", lambda plan: contextlib.nullcontext())
    monkeypatch.setattr(ray_backend, "run_trials", lambda controller, plan: fakes.run_serially(controller, run_trial))
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    code = main(["search", "--train-file", str(tmp_path / "data/train.jsonl"), "--validation-file",
                 str(tmp_path / "data/validation.jsonl"), "--model", str(tiny_model_dir), "--space", "tiny",
                 "--budget", "2", "--epochs", "1", "--portfolio", "none", "--no-baselines", "--finalists", "0",
                 "--study-name", "noise", "--storage", storage])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "one-class floor (predicting one class): dev accuracy" in printed
    assert sum(line.startswith("nothing learned: ") for line in printed.splitlines()) == 1, printed

    import optuna

    from autopelt.report.contents import header
    from autopelt.study.record import read_all

    study = optuna.load_study(study_name="noise", storage=storage)
    floors = Floors.from_dict(study.user_attrs["floors"])
    assert 0.5 < floors.dev < 0.85 and floors.dev_rows > 0
    page = header(study, read_all(study), "accuracy", True)
    assert page.nothing_learned.startswith("nothing learned: ") and page.floors["dev"] == floors.dev
    assert main(["export", "--study", "noise", "--storage", storage, "--out", str(tmp_path / "best")]) == 0
    exported = capsys.readouterr().out
    assert "nothing learned: " in exported
    assert json.loads((tmp_path / "best" / "metrics.json").read_text())["floors"]["dev"] == floors.dev
    assert "one-class floor" in (tmp_path / "best" / "README.md").read_text()


def test_a_floor_is_the_best_one_class_metric_and_zero_for_a_regression():
    from autopelt.data import custom_task

    task = custom_task("t", text_columns=["text"], label_names=["a", "b", "c"])
    assert one_class(task, [0, 1, 1, 2]) == 0.5
    regression = custom_task("r", text_columns=["text"], regression=True)
    assert one_class(regression, [1.0, 2.0]) == 0.0 and one_class(task, []) is None
    floors = Floors(dev=0.5, test=0.52, dev_rows=1000, metric="accuracy")
    assert not floors.learned(0.52) and floors.learned(0.6)  # 3 standard errors of 1,000 rows: 4.7 points
