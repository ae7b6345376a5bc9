"""What the report shows, as plain data: pure functions of a study's trials, no plotting.

Each figure of the report has one function here, and the tests check these numbers; `plots.py` only draws
them. `maximize` is the direction of the dev metric (the study's first objective).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from optuna.trial import FrozenTrial, TrialState

from autopelt.report.trials import (
    GATE_KINDS, baseline_name, better, dev_value, fidelity_text, gate_table, is_answer, label, params_pct,
    test_value,
)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass(frozen=True)
class HistoryPoint:
    number: int
    state: str  # COMPLETE, PRUNED or FAIL
    baseline: str | None
    value: float | None  # dev metric; the last reported one for a pruned trial; None for most failures
    answer: bool  # COMPLETE at full fidelity: counts for the best so far
    best_so_far: float | None  # best answer among trials numbered <= this one
    label: str
    note: str  # fidelity reached, or why it failed


def history(trials: Iterable[FrozenTrial], maximize: bool = True) -> list[HistoryPoint]:
    """Every finished trial in trial-number order, with the best dev metric of answer trials so far."""
    points, best = [], None
    for trial in sorted((t for t in trials if t.state in FINISHED), key=lambda t: t.number):
        answer = is_answer(trial)
        value = dev_value(trial)
        if answer and (best is None or better(value, best, maximize)):
            best = value
        points.append(HistoryPoint(
            number=trial.number, state=trial.state.name, baseline=baseline_name(trial), value=value,
            answer=answer, best_so_far=best, label=label(trial), note=_note(trial),
        ))
    return points


def _note(trial: FrozenTrial) -> str:
    if trial.state == TrialState.FAIL:
        return str(trial.user_attrs.get("fail_reason") or "failed")
    fidelity = fidelity_text(trial)
    if trial.state == TrialState.PRUNED:
        return f"stopped early at epoch {fidelity}"
    return "" if trial.user_attrs.get("full_fidelity") is True else f"not full fidelity ({fidelity})"


@dataclass(frozen=True)
class ParetoPoint:
    number: int
    baseline: str | None
    dev: float
    params_pct: float
    label: str


@dataclass(frozen=True)
class Pareto:
    front: list[ParetoPoint]  # by params % ascending
    dominated: list[ParetoPoint]  # the other answer trials, by trial number


def pareto(trials: Iterable[FrozenTrial], maximize: bool = True) -> Pareto:
    """Answer trials no other answer trial beats on both dev metric and stored params % (lower is better)."""
    points = [
        ParetoPoint(t.number, baseline_name(t), dev_value(t), params_pct(t), label(t))
        for t in sorted(trials, key=lambda t: t.number)
        if is_answer(t) and params_pct(t) is not None
    ]
    on_front = [p for p in points if not any(_dominates(q, p, maximize) for q in points)]
    front_numbers = {p.number for p in on_front}
    return Pareto(
        front=sorted(on_front, key=lambda p: (p.params_pct, p.number)),
        dominated=[p for p in points if p.number not in front_numbers],
    )


def _dominates(a: ParetoPoint, b: ParetoPoint, maximize: bool) -> bool:
    sign = 1 if maximize else -1
    no_worse = sign * a.dev >= sign * b.dev and a.params_pct <= b.params_pct
    return no_worse and (a.dev != b.dev or a.params_pct != b.params_pct)


@dataclass(frozen=True)
class Row:
    """One trial as the report's tables and bars show it."""
    number: int | None
    name: str  # the baseline's name, or "searched"
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING, or "none" when no trial stands for it
    summary: str
    dev: float | None
    test: float | None
    params_pct: float | None
    params_stored: int | None
    fidelity: str
    seconds: float | None
    note: str
    vs_searched: float | None = None  # dev - the best searched trial's dev (baselines only)


def row(trial: FrozenTrial, metric: str) -> Row:
    attrs = trial.user_attrs
    stored, seconds = attrs.get("params_stored"), attrs.get("seconds")
    return Row(
        number=trial.number, name=baseline_name(trial) or "searched", state=trial.state.name,
        summary=str(attrs.get("summary") or "?"), dev=dev_value(trial), test=test_value(trial, metric),
        params_pct=params_pct(trial), params_stored=int(stored) if isinstance(stored, (int, float)) else None,
        fidelity=fidelity_text(trial), seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
        note=_note(trial) if trial.state in FINISHED else "",
    )


def best_trial(trials: Iterable[FrozenTrial], maximize: bool = True) -> FrozenTrial | None:
    """The best answer trial: best dev metric, then fewest stored params, then the earliest."""
    answers = [t for t in trials if is_answer(t)]
    if not answers:
        return None
    sign = 1 if maximize else -1
    pct = {t.number: params_pct(t) if params_pct(t) is not None else float("inf") for t in answers}
    return min(answers, key=lambda t: (-sign * t.values[0], pct[t.number], t.number))


@dataclass(frozen=True)
class Comparison:
    searched: Row | None  # the best searched answer trial
    baselines: list[Row]  # one per baseline name, in the order the study first ran them


def baseline_comparison(trials: Iterable[FrozenTrial], metric: str, maximize: bool = True) -> Comparison:
    """The best searched trial against each baseline's best answer (or, without one, its latest trial)."""
    trials = sorted(trials, key=lambda t: t.number)
    best_searched = best_trial([t for t in trials if baseline_name(t) is None], maximize)
    searched = row(best_searched, metric) if best_searched else None
    rows = []
    for name in dict.fromkeys(baseline_name(t) for t in trials if baseline_name(t)):
        mine = [t for t in trials if baseline_name(t) == name]
        chosen = best_trial(mine, maximize) or mine[-1]
        entry = row(chosen, metric)
        if is_answer(chosen) and searched is not None:
            entry = replace(entry, vs_searched=entry.dev - searched.dev)
        rows.append(entry)
    return Comparison(searched=searched, baselines=rows)


def top_trials(trials: Iterable[FrozenTrial], metric: str, maximize: bool = True, limit: int = 10) -> list[Row]:
    """The best answer trials, best first (ties: fewer stored params, then earlier)."""
    remaining = [t for t in trials if is_answer(t)]
    ordered = []
    while remaining and len(ordered) < limit:
        best = best_trial(remaining, maximize)
        ordered.append(best)
        remaining = [t for t in remaining if t.number != best.number]
    return [row(t, metric) for t in ordered]


@dataclass(frozen=True)
class GateMap:
    number: int
    baseline: str | None
    label: str
    kinds: list[str]  # rows: adapter, prefix, lora, then any other kind
    layers: list[int]  # columns
    values: list[list[float | None]]  # values[row][column]; None where a kind has no gate in that layer


def gate_maps(trials: Iterable[FrozenTrial], maximize: bool = True) -> list[GateMap]:
    """UniPELT's mean gate per kind and layer: the best gated searched trial, then each gated baseline."""
    gated = [t for t in sorted(trials, key=lambda t: t.number)
             if is_answer(t) and gate_table(t.user_attrs.get("gates"))]
    chosen = []
    best_searched = best_trial([t for t in gated if baseline_name(t) is None], maximize)
    if best_searched:
        chosen.append(best_searched)
    for name in dict.fromkeys(baseline_name(t) for t in gated if baseline_name(t)):
        chosen.append(best_trial([t for t in gated if baseline_name(t) == name], maximize))
    return [_gate_map(t) for t in chosen]


def _gate_map(trial: FrozenTrial) -> GateMap:
    table = gate_table(trial.user_attrs.get("gates"))
    kinds = [k for k in GATE_KINDS if k in table] + sorted(k for k in table if k not in GATE_KINDS)
    layers = sorted({layer for values in table.values() for layer in values})
    return GateMap(
        number=trial.number, baseline=baseline_name(trial), label=label(trial), kinds=kinds, layers=layers,
        values=[[table[kind].get(layer) for layer in layers] for kind in kinds],
    )
