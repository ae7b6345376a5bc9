"""A prior built by the lab's pipeline (python -m metalearning prior)."""
from __future__ import annotations

import pytest

from autopelt.portfolio.portfolio import load


def test_a_prior_built_without_a_task_never_saw_it(tmp_path):
    """`python -m metalearning prior --leave-out TASK`: what a live benchmark on TASK runs (bench/search_value.py)."""
    import json

    from autopelt.errors import UserError
    from metalearning import build

    out = tmp_path / "prior.json"
    build.with_prior("shipped", 16, str(out), say=lambda *_: None, leave_out=("hwu64",))
    written = json.loads(out.read_text())
    assert written["built_from"]["left_out"] == ["hwu64"]
    assert "hwu64" not in written["built_from"]["tasks"] and len(written["built_from"]["tasks"]) == 20
    assert "hwu64" not in written["prior"]["tasks"] and "clinc150" in written["prior"]["tasks"]
    assert "hwu64" not in written["calibration"]["rates"]
    assert load(str(out)).prior.k >= 1
    with pytest.raises(UserError, match="--leave-out nosuch"):
        build.with_prior("shipped", 16, str(tmp_path / "x.json"), say=lambda *_: None, leave_out=("nosuch",))
    assert not (tmp_path / "x.json").exists()
