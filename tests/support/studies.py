"""A study holding trained trials' results, as a search would have recorded them (for export tests)."""

from __future__ import annotations

import optuna


def study_of(url: str, name: str, result: dict, result_dir) -> None:
    """Create study `name` at `url` with one finished full-fidelity trial: `result` (a trial's result.json) kept in
    `result_dir`."""
    study = optuna.create_study(study_name=name, storage=url, direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=result["dev_metric"], user_attrs={
        "result_dir": str(result_dir), "full_fidelity": True, "summary": result["summary"],
        "params_pct": result["params"]["stored_pct"]}))
