"""Reading one trial's record (a FrozenTrial and the user attributes of docs/design.md) for the report.

The report's answers (best trial, Pareto front, baselines, importances, gates) use *answer* trials only:
COMPLETE and trained to full fidelity. Early-stopped (PRUNED) and failed trials appear in the history and
in the counts, never in an answer.
"""

from __future__ import annotations

import math
from typing import Any

from optuna.trial import FrozenTrial, TrialState

GATE_KINDS = ("adapter", "prefix", "lora")  # UniPELT's order: the heat map's rows


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_answer(trial: FrozenTrial) -> bool:
    """COMPLETE, trained to full fidelity, with a finite dev metric."""
    return (
        trial.state == TrialState.COMPLETE
        and trial.user_attrs.get("full_fidelity") is True
        and bool(trial.values)
        and is_number(trial.values[0])
    )


def baseline_name(trial: FrozenTrial) -> str | None:
    name = trial.user_attrs.get("baseline")
    return str(name) if name else None


def dev_value(trial: FrozenTrial) -> float | None:
    """The dev metric: the first objective when COMPLETE, else the last reported (intermediate) value."""
    if trial.state == TrialState.COMPLETE and trial.values and is_number(trial.values[0]):
        return float(trial.values[0])
    reported = dict(trial.intermediate_values)
    # multi-objective studies keep intermediate values in a user attribute (Optuna cannot store them)
    for step, value in (trial.user_attrs.get("intermediate") or {}).items():
        reported.setdefault(int(step), value)
    finite = {step: value for step, value in reported.items() if is_number(value)}
    return float(finite[max(finite)]) if finite else None


def test_value(trial: FrozenTrial, metric: str) -> float | None:
    value = (trial.user_attrs.get("test") or {}).get(metric)
    return float(value) if is_number(value) else None


def params_pct(trial: FrozenTrial) -> float | None:
    value = trial.user_attrs.get("params_pct")
    return float(value) if is_number(value) else None


def label(trial: FrozenTrial) -> str:
    """`#9 lora r8 + prefix L10`, or `#0 [unipelt_apl] ...` for a baseline."""
    summary = str(trial.user_attrs.get("summary") or "?")
    name = baseline_name(trial)
    return f"#{trial.number} [{name}] {summary}" if name else f"#{trial.number} {summary}"


def fidelity_text(trial: FrozenTrial) -> str:
    fidelity, top = trial.user_attrs.get("fidelity"), trial.user_attrs.get("max_fidelity")
    if fidelity is None and top is None:
        return ""
    return f"{fidelity if fidelity is not None else '?'}/{top if top is not None else '?'}"


def gate_table(gates: Any) -> dict[str, dict[int, float]]:
    """{kind: {layer: mean gate}} from either stored form: {kind: {"0": g}} or {kind: [g0, g1, ...]}."""
    if not isinstance(gates, dict):
        return {}
    table: dict[str, dict[int, float]] = {}
    for kind, layers in gates.items():
        items = layers.items() if isinstance(layers, dict) else enumerate(layers or [])
        values = {int(layer): float(value) for layer, value in items if _is_layer(layer) and is_number(value)}
        if values:
            table[str(kind)] = values
    return table


def _is_layer(key: Any) -> bool:
    return isinstance(key, int) or (isinstance(key, str) and key.isdigit())


def better(a: float, b: float, maximize: bool) -> bool:
    return a > b if maximize else a < b
