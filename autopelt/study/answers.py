"""Which trials answer a study: the best one, the ranking, the Pareto front. One rule for every reader.

Only answer trials count (`TrialRecord.is_answer`: COMPLETE at full fidelity with a finite dev metric). The best
has the best dev metric; ties, common at chance level, go to the smaller delta (fewer stored parameters), then
to the earlier trial. The search's summary, `autopelt export`, the report and the dashboard launcher all call
`best`, so they name the same trial.
"""

from __future__ import annotations

import math
from typing import Iterable

from autopelt.study.record import TrialRecord


def maximizes(study) -> bool:
    """Whether the study's dev metric (its first objective) is better higher; autopelt's searches maximise it."""
    from optuna.study import StudyDirection

    return study.directions[0] == StudyDirection.MAXIMIZE


def ranked(records: Iterable[TrialRecord], maximize: bool = True) -> list[TrialRecord]:
    """Answer trials, best first."""
    sign = 1 if maximize else -1

    def key(record: TrialRecord) -> tuple:
        size = record.params_pct if record.params_pct is not None else math.inf
        return -sign * record.values[0], size, record.number

    return sorted((r for r in records if r.is_answer), key=key)


def best(records: Iterable[TrialRecord], maximize: bool = True) -> TrialRecord | None:
    order = ranked(records, maximize)
    return order[0] if order else None


def pareto_front(records: Iterable[TrialRecord], maximize: bool = True) -> list[TrialRecord]:
    """Answer trials no other answer trial beats on both dev metric and stored params % (lower is better),
    smallest first. Equal points do not beat each other: both stay on the front."""
    points = [r for r in records if r.is_answer and r.params_pct is not None]
    front = [p for p in points if not any(_dominates(q, p, maximize) for q in points)]
    return sorted(front, key=lambda r: (r.params_pct, r.number))


def _dominates(a: TrialRecord, b: TrialRecord, maximize: bool) -> bool:
    sign = 1 if maximize else -1
    no_worse = sign * a.values[0] >= sign * b.values[0] and a.params_pct <= b.params_pct
    return no_worse and (a.values[0] != b.values[0] or a.params_pct != b.params_pct)
