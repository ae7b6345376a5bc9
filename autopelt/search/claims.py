"""Who may train next when several processes share one study: the rule behind an exact trial budget.

Optuna's RDB storage numbers a new trial while holding a lock on the study row
(`RDBStorage._create_new_trial`: "the calculation of trial.number is prone to race conditions"), so every
trial with a lower number was committed before a trial exists. The rule, checked right after `ask()`:

    trial n may train iff fewer than `budget` trials numbered below n are still alive (not FAIL).

At most `budget` trials end COMPLETE or PRUNED: if budget + 1 did, the highest-numbered of them saw the
other `budget` alive below it when it was checked (a trial's state only moves WAITING -> RUNNING ->
finished, and these never failed), so it was refused. At least `budget` do as long as one process runs:
a process keeps asking while trials that hold a claim may still fail, and only a process with nothing
running leaves the remaining claims to live trials of other processes (a crashed process's trials are
failed as interrupted and re-queued by the next process that starts, see `recovery.py`; a trial it asked
but never marked as its own shows that only by its age, and a process waits for that rather than leave it
the claim).
Trials refused here, and deltas over the parameter budget, are recorded as FAIL with a reason and never
count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from optuna.trial import FrozenTrial, TrialState

from autopelt.study.record import read

ALIVE = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
TRAINED = (TrialState.COMPLETE, TrialState.PRUNED)

# fail reasons that say "this never trained; its work is still to do"
INTERRUPTED = "interrupted"
BUDGET_REACHED = "budget reached"
DUPLICATE_BASELINE = "duplicate baseline"
LATE_BASELINE = "no time for this baseline"  # past the first half of a wall-time budget (baselines.in_play)
NOT_DONE_REASONS = (INTERRUPTED, BUDGET_REACHED, DUPLICATE_BASELINE, LATE_BASELINE)


@dataclass(frozen=True)
class Tally:
    trained: int  # COMPLETE + PRUNED: what the budget counts
    running: int
    waiting: int


def tally(trials: Iterable[FrozenTrial]) -> Tally:
    states = [t.state for t in trials]
    return Tally(
        trained=sum(s in TRAINED for s in states),
        running=states.count(TrialState.RUNNING),
        waiting=states.count(TrialState.WAITING),
    )


def admitted(number: int, trials: Iterable[FrozenTrial], budget: int) -> bool:
    """The rule above, for the trial numbered `number` (itself not counted)."""
    claims = sum(1 for t in trials if t.number < number and t.state in ALIVE)
    return claims < budget


def budget_spoken_for(trials: Iterable[FrozenTrial], budget: int) -> bool:
    """Every remaining unit of budget is held by a trained or running trial: asking now can only be refused."""
    counts = tally(trials)
    return counts.trained + counts.running >= budget


def covers(trial: FrozenTrial) -> bool:
    """Whether this trial stands for its delta: alive, or finished for a reason other than never starting."""
    return trial.state != TrialState.FAIL or read(trial).fail_reason not in NOT_DONE_REASONS


def baseline_covered(name: str, trials: Iterable[FrozenTrial], below: int | None = None) -> bool:
    """A trial of baseline `name` (numbered below `below`, if given) covers it: it needs no other."""
    return any(read(t).baseline == name and covers(t) and (below is None or t.number < below) for t in trials)


def baseline_alive(name: str, trials: Iterable[FrozenTrial], below: int | None = None) -> bool:
    """A trial of baseline `name` (numbered below `below`, if given) is queued, running or trained: another would
    be a duplicate. One that failed, whatever the reason, leaves the baseline to be run again."""
    return any(t.state in ALIVE and read(t).baseline == name and (below is None or t.number < below) for t in trials)
