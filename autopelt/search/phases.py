"""How a budget is split among a search's phases: the baselines, the portfolio's members, the calibration that
waits for LoRA's rate, the finalists; the sampler draws what is left."""

from __future__ import annotations

import dataclasses

from autopelt.search import finalists
from autopelt.search.budget import Budget, TimeBudget, TrialBudget


def baselines_for(budget: Budget, with_portfolio: bool = False) -> list[str]:
    """The study's baselines: all of them, or on a trial budget at most half of it (the first ones), so that a
    study always searches. With a portfolio, UniPELT(APL) alone (none on a budget of one trial, which the
    portfolio's first configuration takes): the single methods at their papers' structure
    did not earn their cost across the meta-dataset's tasks (docs/portfolio.md)."""
    from autopelt.delta.presets import BASELINES

    if with_portfolio:  # a budget of one trial runs the portfolio's first configuration, the prior's favourite
        return list(BASELINES[:1]) if not isinstance(budget, TrialBudget) or budget.trials >= 2 else []
    if isinstance(budget, TimeBudget):
        return list(BASELINES)
    return list(BASELINES[: max(1, budget.trials // 2)])


def calibration_plan(portfolio, note: str, baselines: list[str], budget: Budget):
    """A calibrated portfolio's plan: its calibration (LoRA's sweep) the first baseline, the members waiting for
    its rate; on a budget of two trials it and the portfolio's first alone; on one, no calibration (the portfolio's
    first at its recorded rate, which the line says)."""
    from autopelt.portfolio.portfolio import CALIBRATION_BASELINE

    if isinstance(budget, TrialBudget) and budget.trials < 2:
        line = (f"rates: absolute: measured on {portfolio.model}; a budget of one trial has no room for LoRA's "
                "calibration")
        note = "\n".join(line if old.startswith("rates: ") else old for old in note.split("\n"))
        return dataclasses.replace(portfolio, calibrate=False), note, baselines
    if isinstance(budget, TrialBudget) and budget.trials == 2:
        return portfolio, note, [CALIBRATION_BASELINE]
    return portfolio, note, [CALIBRATION_BASELINE, *(name for name in baselines if name != CALIBRATION_BASELINE)]


def portfolio_size(portfolio, budget: Budget, baselines: int, finalists: int = 0, draws: bool = True) -> int:
    """All its members on a wall-time budget (early stopping sorts them); on a trial budget at most half of it,
    less the baselines, so that the sampler still draws, and at least the first (`baselines_for` leaves it room).
    Where the sampler draws nothing (`--sampler none`), all a trial budget holds besides the baselines and the
    `finalists`."""
    if portfolio is None:
        return 0
    if isinstance(budget, TimeBudget):
        return len(portfolio.members)
    share = budget.trials - baselines - finalists if not draws else budget.trials // 2 - baselines
    return max(1, min(len(portfolio.members), share))


def finalist_count(asked: int | None, workers: int, budget: Budget, baselines: int) -> int:
    """How many of the best trials the search trains again at its end: as asked, else a whole number of rounds
    on the workers (at least 3); on a trial budget no more than it has room for (finalists.trial_room)."""
    count = finalists.default_count(workers) if asked is None else asked
    return count if isinstance(budget, TimeBudget) else finalists.trial_room(budget.trials, count, baselines)
