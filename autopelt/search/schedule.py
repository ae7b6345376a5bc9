"""When the finalists' turn comes (finalists.py says what they are): the search's clock, the room kept for them on a
trial or a wall-time budget, which trial may still start before the room, and which running trial gives its worker
up to them. A pure object over the study's trials and an injected clock: it never writes the study (the controller
queues the finalists when `turn` says so).

What `turn` answers, as `Controller.next_trial` passes it on: None (not there yet: draw on), ASK (a queued finalist
waits to be asked), WAIT (nothing to start now; ask again later) or DONE (nothing more to start in this process).
"""

from __future__ import annotations

import time
from typing import Callable

from optuna.trial import FrozenTrial, TrialState

from autopelt.search import baselines, claims, finalists, refine
from autopelt.search.plan import SearchPlan
from autopelt.study import record
from autopelt.study.record import TrialKind, TrialRecord

WAIT = "wait"  # nothing to start now; ask again later (a running trial may still free budget)
DONE = "done"  # nothing more to start in this process
ASK = "ask"  # a queued finalist waits to be asked


class FinalistSchedule:
    """The finalists' turn in one search process. `clock` gives seconds (time.monotonic unless a test stops it);
    `started` is when the process's budget began; `maximize`: the study's direction (its metric's)."""

    def __init__(self, plan: SearchPlan, maximize: bool = True, clock: Callable[[], float] = time.monotonic):
        self.plan, self.maximize, self.clock = plan, maximize, clock
        self.started = clock()
        self.no_finalists = False  # the finalists' turn came and no trial answered the study
        self.queued = False  # the finalists are seen queued (by this process or another)
        self.superseded: set[int] = set()  # trials stopped to free their worker for the finalists
        self._left_after_baselines: float | None = None  # seconds of a wall-time budget the baselines left

    def elapsed(self) -> float:
        return self.clock() - self.started

    def time_left(self) -> float | None:
        """Seconds left of a wall-time budget; None on a trial budget."""
        if self.plan.deadline_seconds is None:
            return None
        return self.plan.deadline_seconds - self.elapsed()

    def trial_room(self, budget: int) -> int:
        """Trials of a trial budget kept for the finalists (none once no trial could be one)."""
        if self.no_finalists:
            return 0
        return finalists.trial_room(budget, self.plan.finalists, len(self.plan.baselines))

    def turn(self, trials: list[FrozenTrial], budget: int | None, running: bool,
             enqueue: Callable[[int], bool], more: bool = True) -> str | None:
        """Whether the finalists' turn has come (the module's docstring says what each answer means).
        `enqueue(count)` queues the best `count` trials again (the controller writes the study) and says whether
        any was; it is called once, when the turn comes and none are queued yet. `more`: whether any other trial
        may still start (False: the sampler draws none and nothing is queued, `--sampler none`), so that the turn
        comes before the budget is spent."""
        if self.plan.finalists <= 0 or self.no_finalists:
            return None
        if budget is not None:
            count = self.trial_room(budget)
            counts = claims.tally(trials)
            if count <= 0 or (more and counts.trained + counts.running < budget - count):
                return None
        elif not self.queued:  # once queued, a trial drawn now would only be stopped (superseded)
            left, room = self.time_left(), self.time_room(trials)
            if left is None or room is None:
                return None
            if left > room.seconds:  # before the room
                if more and self.next_fits(trials, left, room):
                    return None
                if running:
                    return WAIT  # its worker waits for the finalists
                # nothing runs: the room begins now, rather than after the workers sat idle
            count = room.count
        self.queued = self.queued or finalists.queued(trials)
        if not self.queued:
            if running and budget is not None:  # they may be finalists; on a wall-time budget the
                return WAIT  # finalists start at once (other processes' trials are never waited for)
            if not enqueue(count):
                self.no_finalists = True  # no trial answers the study, or the best were trained again
                return None
            self.queued = True
            return ASK
        if finalists.waiting(trials):
            return ASK
        return WAIT if running else DONE

    def time_room(self, trials: list[FrozenTrial]) -> finalists.Room | None:
        """The finalists' room on a wall-time budget (finalists.py): one round until the baselines have finished,
        then the rounds that fit in a third of what they left, each as long as the slowest trial to train again
        (at least the median trial); None while no trial measures the time of one."""
        records = [record.read(t) for t in trials]
        seconds = finalists.seconds_per_trial(records)
        if seconds is None:
            return None
        workers = self.plan.options.workers
        if self._left_after_baselines is None and refine.due(trials, baselines.in_play(self.plan.baselines, trials)):
            self._left_after_baselines = self.time_left()
        # while they run: one round (they leave less than is left now; the room begins then only if that is little)
        left = self._left_after_baselines if self._left_after_baselines is not None else 0.0
        count = finalists.time_count(self.plan.finalists, workers, left, seconds)
        slowest = finalists.slowest(records, count, self.maximize)
        return finalists.Room(finalists.time_room(max(seconds, slowest or 0.0), count, workers), count, seconds)

    @staticmethod
    def next_fits(trials: list[FrozenTrial], left: float, room: finalists.Room) -> bool:
        """Whether the trial the study asks next can end before the room, with the margin: a queued refinement at
        its own expected time (one that cannot is skipped for the next queued one that can, `ends_before_room`),
        any other trial at the study's median trial. A baseline always starts (in the first half of the budget,
        baselines.py): the study is compared with it; so does the portfolio's first configuration."""
        waiting = sorted((t for t in trials if t.state == TrialState.WAITING), key=lambda t: t.number)
        if waiting and (record.baseline_of(waiting[0]) or record.portfolio_of(waiting[0]).get("rank") == 0):
            return True  # what the study asks next (Optuna pops the oldest queued trial): the portfolio's first
            #              is the prior's favourite, which the budget was checked to hold (budget_fit.py)
        records = [record.read(t) for t in trials]
        for trial in waiting:
            if not record.is_refinement(trial):
                break
            if _fits(record.read(trial).refines, left, room, records):
                return True
        return left - room.seconds >= finalists.MARGIN * room.trial

    def ends_before_room(self, trial, trials: list[FrozenTrial]) -> bool:
        """A refinement starts on a wall-time budget only if it can end before the finalists' room at its own
        expected time (a refinement that began too late was otherwise stopped at its last report)."""
        refines, left = record.refines_of(trial), self.time_left()
        if not refines or left is None or self.queued:
            return True
        room = self.time_room(trials)
        return room is None or _fits(refines, left, room, [record.read(t) for t in trials])

    def supersedes(self, number: int, trial, fidelity: int, max_fidelity: int) -> bool:
        """Whether a running trial gives its worker up now, at its latest report: on a wall-time budget, once the
        finalists are queued, a searched trial or a refinement can no longer be the answer (finalists rank first).
        (On the SNLI benchmark a searched trial of 413 s held a worker into the finalists' room, and the last two
        finalists were cut by the deadline.) Baselines train on: they are the reference the study is compared
        with, and so does a trial that has reported its last epoch: it is trained (a refinement was once stopped
        so, with the study's best dev). On a trial budget every trial has finished before the finalists."""
        if self.plan.deadline_seconds is None or not self.queued or fidelity >= max_fidelity:
            return False
        if record.kind_of(trial) in (TrialKind.FINALIST, TrialKind.BASELINE):
            return False
        self.superseded.add(number)
        return True


def _fits(refines: dict, left: float, room: finalists.Room, records: list[TrialRecord]) -> bool:
    """A refinement (its `refines`) can end before the room, at its expected time with the margin (the study's
    median trial while its baseline has not measured it)."""
    expected = refine.expected_seconds(refines, records)
    return left - room.seconds >= finalists.MARGIN * (room.trial if expected is None else expected)
