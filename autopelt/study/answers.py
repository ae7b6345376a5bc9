"""Which trials answer a study: the best one, the ranking, the Pareto front. One rule for every reader.

Only answer trials count (`TrialRecord.is_answer`: COMPLETE at full fidelity with a finite dev metric). The best
has the best dev metric; ties, common at chance level, go to the smaller delta (fewer stored parameters), then
to the earlier trial. The search's summary, `autopelt export`, the report and the dashboard launcher all call
`best`, so they name the same trial.

Finalists come first. A search ends by training its best few trials again with another seed (finalists.py): one
seed's dev metric picks the luckiest of deltas a point apart, not the best. A finalist's dev metric is then the
mean over its seeds, and finalists rank before every other trial, whose single seed would otherwise win on luck.

The portfolio's first configuration is the prior's favourite (autopelt/portfolio): in a study that ran it, another
trial ranks before it only if its dev accuracy is higher by more than MARGIN_SE standard errors of the difference.
MARGIN_SE is 0: any higher dev answers, and the favourite wins a tie. A one-standard-error rule (1.0), fixed in
advance on the first 12 tasks, cost on the 9 tasks it was not chosen on (docs/portfolio.md, "Rules judged again").
"""

from __future__ import annotations

import math
from typing import Iterable

from autopelt.study import record
from autopelt.study.record import TrialRecord


MARGIN_SE = 0.0
DEV_ROWS = 1000  # the protocols' dev size (K-shot: 1,000; full: at most 1,000)


def beats(challenger: float, incumbent: float, margin: float = MARGIN_SE, rows: int = DEV_ROWS) -> bool:
    """Whether a dev accuracy beats the incumbent's by more than `margin` standard errors of their difference,
    sqrt(2 p (1 - p) / rows) at their mean p (0: any higher value does). Near 80% on 1,000 rows one standard error
    is about 1.8 points."""
    if margin <= 0:
        return challenger > incumbent
    p = min(max((challenger + incumbent) / 2, 0.0), 1.0)
    return challenger - incumbent > margin * math.sqrt(2 * p * (1 - p) / rows)


def maximizes(study) -> bool:
    """Whether the study's dev metric (its first objective) is better higher; autopelt's searches maximise it."""
    from optuna.study import StudyDirection

    return study.directions[0] == StudyDirection.MAXIMIZE


def seed_devs(records: Iterable[TrialRecord]) -> dict[int, list[float]]:
    """{trial number: its dev metric and those of the finished finalists that train it again, seed by seed} for
    every answer trial that has at least one (finalists.py); other trials are absent."""
    return record.seed_devs(records)


def dev_score(record: TrialRecord, devs: dict[int, list[float]]) -> float:
    """The dev metric ranked by: the mean over seeds for a finalist (`seed_devs`), else the trial's own."""
    seeds = devs.get(record.number)
    return sum(seeds) / len(seeds) if seeds else float(record.values[0])


def ranked(records: Iterable[TrialRecord], maximize: bool = True) -> list[TrialRecord]:
    """Answer trials, best first: finalists by their mean dev over seeds, then the rest by their dev."""
    records = list(records)
    devs = seed_devs(records)
    sign = 1 if maximize else -1

    def key(record: TrialRecord) -> tuple:
        size = record.params_pct if record.params_pct is not None else math.inf
        return record.number not in devs, -sign * dev_score(record, devs), size, record.number

    order = sorted((r for r in records if r.is_answer), key=key)
    return _favourite_first(order, devs) if maximize else order


def _favourite_first(order: list[TrialRecord], devs: dict[int, list[float]]) -> list[TrialRecord]:
    """The portfolio's first configuration first, unless the best other trial beats it (`beats`)."""
    favourite = next((r for r in order if r.portfolio.get("rank") == 0), None)
    if favourite is None or order[0] is favourite or not 0 <= dev_score(favourite, devs) <= 1:
        return order
    if beats(dev_score(order[0], devs), dev_score(favourite, devs)):
        return order
    return [favourite, *(r for r in order if r is not favourite)]


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
