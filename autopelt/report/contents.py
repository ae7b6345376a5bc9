"""Everything one report shows, gathered from a study in one read: the header and the data of each figure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from autopelt.models import model_name
from autopelt.report.data import (
    Comparison, GateMap, HistoryPoint, Pareto, Row, baseline_comparison, gate_maps, history, pareto, row,
    top_trials,
)
from autopelt.report.ensemble import EnsembleView, ensemble_view
from autopelt.report.importance import Importances, param_importances
from autopelt.study import answers
from autopelt.study.info import floors_of, read_study
from autopelt.study.record import TrialRecord, read_all

STATE_ORDER = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")


@dataclass(frozen=True)
class Header:
    study: str
    task: str
    model: str
    space: str
    metric: str  # of test (and of dev, but where dev_label says otherwise)
    maximize: bool
    protocol: str
    states: dict[str, int]  # trials by state, in STATE_ORDER, zeros left out
    answers: int  # COMPLETE at full fidelity
    best: Row | None
    best_hparams: dict = field(default_factory=dict)
    best_spec: dict = field(default_factory=dict)  # the delta spec (docs/design.md), to rebuild the best delta
    fail_reasons: list[tuple[str, int]] = field(default_factory=list)  # most common first
    dev_label: str = ""  # what the dev objective is: the metric, or "-loss" in a generation study
    floors: dict = field(default_factory=dict)  # each split's one-class floor (autopelt/study/floors.py)
    nothing_learned: str = ""  # the nothing-learned line, when every answer sits at the dev floor


@dataclass(frozen=True)
class ReportContents:
    header: Header
    history: list[HistoryPoint]
    pareto: Pareto
    comparison: Comparison
    importances: Importances
    gates: list[GateMap]
    top: list[Row]
    ensemble: EnsembleView | None = None  # the study's ensemble beside its answer; None: no dev predictions here


def collect(study: optuna.Study, top: int = 10) -> ReportContents:
    trials = read_all(study)
    maximize = answers.maximizes(study)
    metric = read_study(study).metric or "dev metric"
    return ReportContents(
        header=header(study, trials, metric, maximize),
        history=history(trials, maximize),
        pareto=pareto(trials, maximize),
        comparison=baseline_comparison(trials, metric, maximize),
        importances=param_importances(trials, maximize),
        gates=gate_maps(trials, maximize),
        top=top_trials(trials, metric, maximize, top),
        ensemble=ensemble_view(study),
    )


def dev_label(info, metric: str) -> str:
    """The study's first objective as the search named it ("dev -loss" -> "-loss"), else the metric."""
    first = info.objectives[0] if info.objectives else ""
    return first[4:] if first.startswith("dev ") else metric


def header(study: optuna.Study, trials: list[TrialRecord], metric: str, maximize: bool) -> Header:
    info = read_study(study)
    states = Counter(t.state.name for t in trials)
    best = answers.best(trials, maximize)
    reasons = Counter(_first_line(t.fail_reason) for t in trials if t.state == TrialState.FAIL)
    return Header(
        study=study.study_name, task=info.task or "?", model=model_name(info.model) if info.model else "?",
        space=info.space or "?", metric=metric, maximize=maximize, protocol=protocol_text(info.protocol),
        dev_label=dev_label(info, metric),
        states={name: states[name] for name in STATE_ORDER if states[name]},
        answers=sum(1 for t in trials if t.is_answer),
        best=row(best, metric) if best else None,
        best_hparams=dict(best.hparams or best.params) if best else {},
        best_spec=dict(best.spec or {}) if best else {},
        fail_reasons=reasons.most_common(),
        floors=floors_of(study),
        nothing_learned=_nothing_learned(study, trials, metric),
    )


def _nothing_learned(study: optuna.Study, trials: list[TrialRecord], metric: str) -> str:
    from autopelt.study.floors import Floors, nothing_learned

    devs = [t.values[0] for t in trials if t.state == TrialState.COMPLETE and t.values]
    return nothing_learned(Floors.from_dict(floors_of(study)), devs, metric) or ""


def protocol_text(protocol) -> str:
    """{"name": "k-shot", "k": 1000, ...} -> "k-shot (k=1000)"; anything else as it is."""
    if isinstance(protocol, dict):
        name = str(protocol.get("name", "?"))
        return f"{name} (k={protocol['k']})" if protocol.get("k") else name
    return "?" if protocol is None else str(protocol)


def _first_line(reason) -> str:
    text = str(reason or "no reason recorded").strip()
    line = text.splitlines()[0] if text else "no reason recorded"
    return line if len(line) <= 100 else line[:99] + "…"
