"""What the report shows, as plain data: pure functions of a study's trial records, no plotting.

Each figure of the report has one function here, and the tests check these numbers; `plots.py` only draws
them. `maximize` is the direction of the dev metric (the study's first objective). Which trials answer the
study, which is best and which are on the Pareto front is autopelt/study/answers.py's to say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from optuna.trial import TrialState

from autopelt.delta.registry import in_gate_order
from autopelt.delta.spec import METHODS  # noqa: F401  (registers the built-in methods, whose entries order the gates)
from autopelt.study import answers
from autopelt.study.record import FOR_FINALISTS, TIME_BUDGET, TrialRecord

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


def history(trials: Iterable[TrialRecord], maximize: bool = True) -> list[HistoryPoint]:
    """Every finished trial in trial-number order, with the best dev metric of answer trials so far."""
    points, best = [], None
    for trial in sorted((t for t in trials if t.state in FINISHED), key=lambda t: t.number):
        value = trial.dev_value
        if trial.is_answer and (best is None or (value > best if maximize else value < best)):
            best = value
        points.append(HistoryPoint(
            number=trial.number, state=trial.state.name, baseline=trial.baseline, value=value,
            answer=trial.is_answer, best_so_far=best, label=trial.label, note=_note(trial),
        ))
    return points


def _note(trial: TrialRecord) -> str:
    if trial.state == TrialState.FAIL:
        return trial.fail_reason or "failed"
    if trial.state == TrialState.PRUNED:
        why = {FOR_FINALISTS: " to free its worker for the finalists", TIME_BUDGET: " by the time budget"}
        return f"stopped early at epoch {trial.fidelity_text}{why.get(trial.stopped_by, '')}"
    return "" if trial.full_fidelity else f"not full fidelity ({trial.fidelity_text})"


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


def pareto(trials: Iterable[TrialRecord], maximize: bool = True) -> Pareto:
    """The study's Pareto front (dev metric against stored params %), and the other answer trials beside it."""
    trials = list(trials)
    front = answers.pareto_front(trials, maximize)
    on_front = {t.number for t in front}
    dominated = [t for t in sorted(trials, key=lambda t: t.number)
                 if t.is_answer and t.params_pct is not None and t.number not in on_front]
    return Pareto(front=[_point(t) for t in front], dominated=[_point(t) for t in dominated])


def _point(trial: TrialRecord) -> ParetoPoint:
    return ParetoPoint(trial.number, trial.baseline, trial.dev_value, trial.params_pct, trial.label)


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
    phase: str = ""  # which step of the search ran it (TrialRecord.phase): "portfolio #1", "baseline lora", …
    dev_of: str = ""  # what `dev` is when not one seed's: "mean of 2 seeds"


def row(trial: TrialRecord, metric: str) -> Row:
    return Row(
        number=trial.number, name=trial.baseline or "searched", state=trial.state.name,
        summary=trial.summary or "?", dev=trial.dev_value, test=trial.test_value(metric),
        params_pct=trial.params_pct, params_stored=trial.params_stored, fidelity=trial.fidelity_text,
        seconds=trial.seconds, note=_note(trial) if trial.state in FINISHED else "", phase=trial.phase,
        dev_of=trial.dev_of,
    )


@dataclass(frozen=True)
class Comparison:
    searched: Row | None  # the best searched answer trial
    baselines: list[Row]  # one per baseline name, in the order the study first ran them


def baseline_comparison(trials: Iterable[TrialRecord], metric: str, maximize: bool = True) -> Comparison:
    """The best searched trial against each baseline's best answer (or, without one, its latest trial)."""
    trials = sorted(trials, key=lambda t: t.number)
    best_searched = answers.best([t for t in trials if t.baseline is None], maximize)
    searched = row(best_searched, metric) if best_searched else None
    rows = []
    for name in dict.fromkeys(t.baseline for t in trials if t.baseline):
        mine = [t for t in trials if t.baseline == name]
        chosen = answers.best(mine, maximize) or mine[-1]
        entry = row(chosen, metric)
        if chosen.is_answer and searched is not None:
            entry = replace(entry, vs_searched=entry.dev - searched.dev)
        rows.append(entry)
    return Comparison(searched=searched, baselines=rows)


def top_trials(trials: Iterable[TrialRecord], metric: str, maximize: bool = True, limit: int = 10) -> list[Row]:
    """The best answer trials, best first (the ranking of autopelt/study/answers.py); a finalist with its mean dev
    over seeds, the one it was ranked by."""
    trials = list(trials)
    devs = answers.seed_devs(trials)
    rows = []
    for trial in answers.ranked(trials, maximize)[:limit]:
        entry = row(trial, metric)
        seeds = devs.get(trial.number)
        if seeds:
            each = ", ".join(f"{value:.4f}" for value in seeds)
            note = f"finalist: mean dev of {len(seeds)} seeds ({each})"
            note = f"{note}; {entry.note}" if entry.note else note
            entry = replace(entry, dev=answers.dev_score(trial, devs), note=note)
        rows.append(entry)
    return rows


@dataclass(frozen=True)
class GateMap:
    number: int
    baseline: str | None
    label: str
    kinds: list[str]  # rows: by the methods' entries' `gate_row` (adapter, prefix, lora), then any other kind
    layers: list[int]  # columns
    values: list[list[float | None]]  # values[row][column]; None where a kind has no gate in that layer


def gate_maps(trials: Iterable[TrialRecord], maximize: bool = True) -> list[GateMap]:
    """UniPELT's mean gate per kind and layer: the best gated searched trial, then each gated baseline."""
    gated = [t for t in sorted(trials, key=lambda t: t.number) if t.is_answer and t.gates]
    chosen = []
    best_searched = answers.best([t for t in gated if t.baseline is None], maximize)
    if best_searched:
        chosen.append(best_searched)
    for name in dict.fromkeys(t.baseline for t in gated if t.baseline):
        chosen.append(answers.best([t for t in gated if t.baseline == name], maximize))
    return [_gate_map(t) for t in chosen]


def _gate_map(trial: TrialRecord) -> GateMap:
    table = trial.gates
    kinds = in_gate_order(table)  # the methods' entries say the rows' order (UniPELT's: adapter, prefix, lora)
    layers = sorted({layer for values in table.values() for layer in values})
    return GateMap(
        number=trial.number, baseline=trial.baseline, label=trial.label, kinds=kinds, layers=layers,
        values=[[table[kind].get(layer) for layer in layers] for kind in kinds],
    )
