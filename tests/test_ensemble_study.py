"""study_ensemble on synthetic trial folders: members, the single answer beside them, what is left out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autopelt.ensemble.select import Rule
from autopelt.ensemble.study import study_ensemble
from autopelt.errors import UserError
from autopelt.train.predictions import save


def _trial(folder, probabilities, labels, dev, data_seed=0, status="ok"):
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({
        "status": status, "task": "sst2", "model": "m", "metric": "accuracy", "dev_metric": dev,
        "summary": folder.name, "settings": {"seed": 0, "data_seed": data_seed}}))
    if status == "ok":
        save(folder, {"dev": np.asarray(probabilities, dtype=np.float16), "dev_labels": labels})
    return folder


def test_the_study_ensemble_beats_its_single_answer_and_says_so(tmp_path):
    labels = np.array([1, 1])
    a = [[0.1, 0.9], [0.6, 0.4]]  # right on row 0 (0.9), wrong on row 1
    b = [[0.95, 0.05], [0.1, 0.9]]  # wrong on row 0, right on row 1; 2a + b is right on both
    dirs = [_trial(tmp_path / "a", a, labels, 0.5), _trial(tmp_path / "b", b, labels, 0.5),
            _trial(tmp_path / "other-dev", a, labels, 0.4, data_seed=1),
            _trial(tmp_path / "failed", None, labels, None, status="failed")]
    chosen = study_ensemble(dirs, rule=Rule(max_size=3), margin=0.25)
    assert [m.folder.name for m in chosen.members] == ["a", "b"] and chosen.weights == pytest.approx([2 / 3, 1 / 3])
    assert chosen.dev == 1.0 and chosen.single_dev == 0.5 and chosen.answers and chosen.forward_passes == 2
    lines = chosen.lines()
    assert "the ensemble answers" in lines[0] and "2 forward passes" in lines[0]
    assert any("other-dev: another dev set" in line for line in lines)
    assert any("failed: not finished" in line for line in lines)
    assert not study_ensemble(dirs, rule=Rule(max_size=3), margin=0.5).answers
    assert study_ensemble(dirs, rule=Rule(max_size=3), max_members=1).forward_passes == 1
    json.dumps(chosen.to_dict())


def test_no_usable_trial_is_a_one_line_error(tmp_path):
    with pytest.raises(UserError, match="no finished trial with dev predictions"):
        study_ensemble([_trial(tmp_path / "x", None, np.array([1]), None, status="failed")])


def test_the_ensemble_is_set_beside_the_studys_answer_and_what_was_left_out_is_one_line(tmp_path):
    """The study answers with its own rule (a finalist's mean over seeds, the portfolio's favourite on a tie), not
    always the best dev: the ensemble line compares with that trial, on its predictions."""
    labels = np.array([1, 1, 1, 1])
    best = [[0.1, 0.9], [0.1, 0.9], [0.4, 0.6], [0.9, 0.1]]  # 3 of 4
    other = [[0.55, 0.45], [0.55, 0.45], [0.55, 0.45], [0.05, 0.95]]  # 1 of 4; with `best`, 4 of 4
    answer = [[0.1, 0.9], [0.1, 0.9], [0.9, 0.1], [0.9, 0.1]]  # 2 of 4: the study's answer nonetheless
    dirs = [_trial(tmp_path / "best", best, labels, 0.75), _trial(tmp_path / "other", other, labels, 0.25),
            _trial(tmp_path / "answer", answer, labels, 0.5)]
    dirs += [tmp_path / f"stopped-{i}" for i in range(3)]  # stopped early: no result.json
    plain = study_ensemble(dirs, rule=Rule(max_size=3), margin=0.3)
    beside = study_ensemble(dirs, rule=Rule(max_size=3), margin=0.3, answer_dir=str(tmp_path / "answer"))
    assert plain.single.folder.name == "best" and plain.single_dev == 0.75
    assert beside.single.folder.name == "answer" and beside.single_dev == 0.5
    assert beside.dev == plain.dev == 1.0 and len(beside.members) == 2
    assert beside.answers and not plain.answers  # 1.0 beats 0.5 by more than the margin, not 0.75
    lines = beside.lines()
    assert "the single answer's 0.5000, on the dev rows that chose its members (answer)" in lines[0]
    left = [line for line in lines if "left out" in line]
    assert left == [next(line for line in lines if line.startswith("  left out: 3 trial(s) ("))]
    assert "… 1 more" in left[0]
