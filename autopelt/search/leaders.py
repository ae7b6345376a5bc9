"""How the budget after a portfolio is spent (`--sampler`): what the study draws once its members are queued.

- `tpe` (default) and `random`: Optuna's sampler draws every trial left, learning from the members it has seen.
- `leaders`: once every member has finished, the BEST members that lead the study (answers.ranked, the study's one
  rule for "best") train again at each of FACTORS times their rate, then TPE draws the rest. A portfolio's rates
  were learned across tasks; a task's best rate moves around them, and after the rate the variants of a method land
  close together (Lee et al., "Learning Rate Matters", 2026).
- `none`: the portfolio alone. Its members take what the sampler would (on a trial budget all it holds besides the
  baselines and the finalists' room); when no queued trial is left, the finalists' turn comes at once.

A leader's variant is a portfolio trial tagged {"name", "leader": its rank, "factor"} (no "rank": it is not the
prior's favourite, answers._favourite_first); it trains at FACTOR times the member's rate as `--rates` reads it and
to the end (a first epoch ranks rates poorly; refine.py stops none either). Which share pays is measured live in
lab/experiments/sampler-share (docs/search.md).
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from autopelt.study import answers, record
from autopelt.study.record import attrs

BEST = 2  # members trained again
FACTORS = (0.5, 2.0)  # times each one's rate


def draws(sampler: str) -> bool:
    """Whether the sampler draws trials of its own (all but `none`)."""
    return sampler != "none"


def is_variant(trial) -> bool:
    """A leader's variant (live optuna.Trial, FrozenTrial): a portfolio trial at another factor of its rate."""
    return "factor" in record.portfolio_of(trial)


def due(trials: list[FrozenTrial]) -> bool:
    """Every portfolio member queued has finished (none waits or runs), and one did."""
    members = [t for t in trials if record.portfolio_of(t) and not is_variant(t)]
    return bool(members) and all(t.state not in (TrialState.WAITING, TrialState.RUNNING) for t in members)


def queued(trials: list[FrozenTrial]) -> bool:
    """A variant was queued in this study (by this process or another, now or in an earlier run)."""
    return any(is_variant(t) for t in trials)


def variants(trials: list[FrozenTrial], maximize: bool = True) -> list[dict]:
    """The tags to queue: each of the BEST members that answer the study at each of FACTORS, best member first."""
    members = [r for r in map(record.read, trials) if isinstance(r.portfolio.get("rank"), int)]
    return [{"name": r.portfolio["name"], "leader": r.portfolio["rank"], "factor": factor}
            for r in answers.ranked(members, maximize)[:BEST] for factor in FACTORS]


def enqueue(study: optuna.Study, trials: list[FrozenTrial], limit: int | None = None) -> int:
    """Queue the leaders' variants, at most `limit`; how many."""
    tags = variants(trials, answers.maximizes(study))[:limit]
    for tag in tags:
        study.enqueue_trial({}, user_attrs=attrs(portfolio=tag))
    return len(tags)
