"""bench/answer_forms.py: each form's paired gain over the single answer, and the rule that decides `--copies`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import answer_forms  # noqa: E402


def row(task: str, seed: int, single: float, ensemble: float, distilled: float, copies: float | None) -> dict:
    found = {"task": task, "seed": seed, "single_test": single, "single_passes": 1, "single_seconds": 10.0,
             "ensemble_test": ensemble, "ensemble_passes": 4, "ensemble_seconds": 40.0,
             "distilled_test": distilled, "distilled_passes": 1, "distilled_seconds": 10.0}
    if copies is not None:
        found.update(distilled_copies_test=copies, distilled_copies_passes=1, distilled_copies_seconds=5.0)
    return found


def forms(table: list[dict]) -> dict[str, dict]:
    return {entry["form"]: entry for entry in table}


def test_gains_are_paired_with_the_single_answer_and_the_distilled_share_is_of_the_ensembles_gain():
    rows = [row("a", 0, 0.80, 0.82, 0.81, None), row("b", 0, 0.70, 0.74, 0.72, None)]
    table = forms(answer_forms.summarise(rows))
    assert table["ensemble"]["gain"] == pytest.approx(3.0)
    assert table["ensemble"]["worst"] == pytest.approx(2.0)
    assert table["ensemble"]["time_vs_single"] == pytest.approx(4.0)
    assert table["distilled"]["share_of_ensemble_gain"] == pytest.approx(0.5)
    assert "distilled_copies" not in table


def six(copies_gain: list[float], tasks: int = 3) -> list[dict]:
    return [row(f"t{i % tasks}", i, 0.8, 0.82, 0.80, 0.80 + gain / 100) for i, gain in enumerate(copies_gain)]


def test_copies_become_the_default_only_by_the_rule_fixed_before_they_ran():
    def decides(rows: list[dict]) -> bool:
        return answer_forms.copies_by_default(answer_forms.summarise(rows))

    assert decides(six([0.6] * 6))
    assert not decides(six([0.6] * 5))  # fewer than six studies
    assert not decides(six([0.6] * 6, tasks=2))  # fewer than three tasks
    assert not decides(six([0.4] * 6))  # under +0.5 on the mean
    assert not decides(six([2.0, 2.0, 2.0, 2.0, 2.0, -1.5]))  # one study loses more than 1.0
    table = forms(answer_forms.summarise(six([2.0, 2.0, 2.0, 2.0, 2.0, -1.5])))
    assert table["distilled_copies"]["worst_over_distilled"] == pytest.approx(-1.5)
