"""The end of a search: its best few trials trained again with another seed, and the answer picked by their mean.

One seed's dev metric picks the luckiest of deltas that sit within about a point of each other; the mean dev of two
seeds ranks them by test far better (docs/search.md, Finalists; `lab/experiments/selection/dev_ranks.py`). So the
budget keeps room for the finalists: when the rest of it is spent (on a trial budget, once this process's trials
have finished, so they can be finalists), the best `finalists` answer trials (`answers.ranked`) are queued once
more, each with its own delta, learning rate and batch size, the study's rows, and training seed `--seed` + 1000
(far from the 1, 2, 3, ... of `autopelt export --reseed` and of a user's seed sweep, so that re-running the answer with
those shares no run with its selection). They are never stopped early, and the answer is the finalist with the
best mean dev (answers.py).

The room: on a trial budget, `finalists` trials of it; on a wall-time budget, enough time for their rounds on the
workers, at the own wall time of the slowest trial they train again (or the study's median trial, if longer; both
without a learning-rate sweep) with a MARGIN, and as many rounds as fit in a third of the time the baselines left,
at least one, at most `finalists` trials (the trial budget's rule, `trial_room`); one round while a baseline still
runs (what they leave is less than what is left then). A trial that cannot end before the room is not started
(`FinalistSchedule.ends_before_room`, schedule.py; a refinement is timed by its own baseline,
refine.expected_seconds): its worker waits, and when nothing else runs the finalists start at once. A searched trial
or refinement still running when the finalists are queued is stopped at its next report
(`FinalistSchedule.supersedes`): it could not be a finalist. Until a trial has finished there is no measure, and the
search runs on. When their turn comes is schedule.py's; this module says what they are and how much room they take.

Why a third, and one round while a baseline runs: docs/search.md (Finalists).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autopelt.errors import UserError
from autopelt.search.claims import ALIVE
from autopelt.study import answers, record
from autopelt.study.record import TrialRecord

SEED_OFFSET = 1000
PER_WORKER = 3  # finalists by default: at least 3, a whole number of rounds on the workers
MARGIN = 1.15  # times the median trial, for the room and a trial to start before it. Why: docs/search.md (Finalists)


def seed_for(study_seed: int) -> int:
    """The training seed of the finalists of a study trained with `study_seed`."""
    return study_seed + SEED_OFFSET


def default_count(workers: int) -> int:
    """--finalists when not given: 3, rounded up to whole rounds of the workers (4 on 2 workers)."""
    return workers * math.ceil(PER_WORKER / workers)


def trial_room(budget: int, finalists: int, baselines: int) -> int:
    """Finalists a trial budget keeps room for: at most a third of what the baselines leave, so a study of 20
    trials still searches (6 baselines, 3 finalists and up to 4 refinements leave 7 drawn deltas)."""
    return max(0, min(finalists, (budget - baselines) // 3))


def seconds_of(trial: TrialRecord) -> float | None:
    """The wall time of a trial trained to its last epoch, without its rate sweep (a finalist trains at the rate
    the sweep chose); None for any other trial."""
    if trial.state != TrialState.COMPLETE or not trial.full_fidelity or not trial.seconds:
        return None
    sweep = trial.lr_choice.get("seconds") if trial.lr_choice.get("how") == "sweep" else 0
    return trial.seconds - (sweep if isinstance(sweep, (int, float)) else 0)


def seconds_per_trial(records: Iterable[TrialRecord]) -> float | None:
    """The median wall time of the study's trials trained to their last epoch, without their rate sweeps; None
    before one has."""
    spent = [seconds for seconds in map(seconds_of, records) if seconds is not None]
    return statistics.median(spent) if spent else None


def slowest(records: Iterable[TrialRecord], count: int, maximize: bool = True) -> float | None:
    """The longest own wall time of the trials that would be the finalists now (`choose`): a round lasts as
    long as its slowest trial, which may well be longer than the study's median."""
    records = list(records)
    chosen = {item["trial"] for item in choose(records, count, 0, maximize)}
    spent = [seconds_of(r) for r in records if r.number in chosen]
    return max((s for s in spent if s is not None), default=None)


def time_count(finalists: int, workers: int, left: float, seconds: float) -> int:
    """Finalists a wall-time budget keeps room for: the whole rounds on the workers that fit in a third of the
    `left` seconds the baselines left (at least one round), at most `finalists`."""
    rounds = max(1, int(left / 3 // (seconds * MARGIN)))
    return max(0, min(finalists, rounds * workers))


@dataclass(frozen=True)
class Room:
    """What a wall-time budget keeps for its finalists, as measured now."""
    seconds: float  # at the end of the budget
    count: int  # finalists
    trial: float  # the study's median trial: another trial starts only if it can end before the room


def time_room(seconds: float, count: int, workers: int) -> float:
    """Seconds of a wall-time budget kept for `count` finalists: their rounds on the workers, at `seconds` a
    trial with the MARGIN."""
    return math.ceil(count / workers) * seconds * MARGIN if count > 0 else 0.0


def queued(trials: list[FrozenTrial]) -> bool:
    """Finalists were queued after every other trial of the study began: by this process or another, now or in
    an earlier run. A run with a larger budget searches on, and then queues the finalists of that end."""
    alive = [t for t in trials if t.state in ALIVE]
    return bool(alive) and bool(record.finalist_of(max(alive, key=lambda t: t.number)))


def waiting(trials: list[FrozenTrial]) -> bool:
    """A queued finalist has not started yet."""
    return any(t.state == TrialState.WAITING and record.read(t).finalist_of for t in trials)


def choose(records: Iterable[TrialRecord], count: int, seed: int, maximize: bool = True) -> list[dict]:
    """[{"trial", "seed"}]: the best `count` answer trials not trained again yet (a study's budget may grow after
    its finalists ran), to train again with `seed`."""
    records = list(records)
    again = {r.finalist_of.get("trial") for r in records if r.finalist_of and r.state in ALIVE}
    best = answers.ranked((r for r in records if r.number not in again), maximize)[:count]
    return [{"trial": r.number, "seed": seed} for r in best]


def enqueue(study: optuna.Study, trials: list[FrozenTrial], count: int, seed: int) -> int:
    """Queue the finalists of `trials`; how many."""
    chosen = choose((record.read(t) for t in trials), count, seed, answers.maximizes(study))
    for item in chosen:
        study.enqueue_trial({}, user_attrs=record.attrs(finalist_of=item))
    return len(chosen)


def settings_of(original: TrialRecord) -> tuple[dict, dict]:
    """(spec, hparams) a finalist trains with again: the trial's own (rate_policy puts it at the rate the trial
    trained at: a baseline's sweep is not run twice).

    Raises:
        UserError: the trial recorded no delta or no learning rate.
    """
    if not original.spec or original.learning_rate is None:
        raise UserError(f"trial {original.number} recorded no delta or learning rate to train again")
    return original.spec, dict(original.hparams)
