"""Greedy forward selection of a portfolio (auto-sklearn 2.0, TabRepo's zero-shot selection).

Given a (tasks x configurations) matrix of dev scores, a configuration's normalised regret on a task is its
distance from the task's best score in units of the task's spread (best minus median), clipped at `CLIP` so that a
configuration that collapses on one task does not outweigh everything else. A portfolio's regret on a task is the
least regret of its members (the search runs all of them and keeps the best); the selection adds, one at a time,
the configuration that lowers the mean portfolio regret over tasks the most; among equal gains (once every task is
covered, say) the one with the lowest regret of its own, then the earlier configuration.
"""

from __future__ import annotations

import statistics

CLIP = 2.0
SPREAD_FLOOR = 1e-3  # a task where every configuration scores alike adds no regret, rather than dividing by 0


def normalised_regret(scores: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """task -> config -> regret in [0, CLIP], from task -> config -> score (higher is better)."""
    regret = {}
    for task, row in scores.items():
        best, median = max(row.values()), statistics.median(row.values())
        spread = max(best - median, SPREAD_FLOOR)
        regret[task] = {config: min(CLIP, (best - value) / spread) for config, value in row.items()}
    return regret


def greedy_portfolio(scores: dict[str, dict[str, float]], size: int,
                     weights: dict[str, float] | None = None) -> list[str]:
    """The ordered portfolio of at most `size` configurations; only configurations scored on every task count.
    `weights` (task -> weight, default equal) weighs each task's regret in the mean the greedy step minimises."""
    regret = normalised_regret(scores)
    tasks = list(regret)
    configs = [c for c in next(iter(regret.values())) if all(c in regret[t] for t in tasks)]

    def mean(values: dict[str, float]) -> float:
        if weights is None:
            return statistics.mean(values.values())
        return sum(weights[t] * values[t] for t in tasks) / sum(weights[t] for t in tasks)

    alone = {c: mean({t: regret[t][c] for t in tasks}) for c in configs}
    chosen: list[str] = []
    current = {t: CLIP for t in tasks}  # an empty portfolio answers nothing
    while len(chosen) < min(size, len(configs)):
        def mean_with(config: str) -> tuple[float, float]:
            return round(mean({t: min(current[t], regret[t][config]) for t in tasks}), 9), alone[config]

        best = min((c for c in configs if c not in chosen), key=mean_with)
        chosen.append(best)
        current = {t: min(current[t], regret[t][best]) for t in tasks}
    return chosen


def mean_regret(scores: dict[str, dict[str, float]], portfolio: list[str]) -> float:
    regret = normalised_regret(scores)
    return statistics.mean(min(regret[t][c] for c in portfolio) for t in regret)
