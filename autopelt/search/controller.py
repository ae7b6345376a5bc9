"""The controller: the one place that writes the study. Runners (Ray Tune) ask it what to train and tell it
what happened; it never trains anything itself.

A trial's way through it: ask -> claim (exact trial budget, claims.py) -> draw its delta by its kind (draw.py: the
space's draw, a queued baseline's preset, a portfolio member, or a finalist's own delta) -> count its parameters
and refuse it if over --max-params (FAIL, draw again: over-budget deltas never cost compute) -> its TrialSettings
(SearchPlan.trial_settings) in a Ticket for the runner -> report per evaluation (intermediate values) -> finish
(COMPLETE / FAIL), stop_early (PRUNED), or crash (FAIL), each recorded by its recorder (recorder.py). What it
writes is the study record of autopelt/study/record.py.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autopelt.errors import UserError
from autopelt.portfolio.portfolio import CALIBRATION_BASELINE
from autopelt.search import baselines, claims, finalists, leaders, portfolio_phase, rate_policy, recovery, refine
from autopelt.search.baselines import baseline_spec, enqueue_missing
from autopelt.search.budget import TrialBudget
from autopelt.search.draw import draw_trial
from autopelt.search.plan import SearchPlan
from autopelt.search.recorder import TrialRecorder
from autopelt.search.schedule import ASK, DONE, WAIT, FinalistSchedule
from autopelt.study import answers, optuna_private, record
from autopelt.study.info import read_study
from autopelt.study.record import TrialKind
from autopelt.train.settings import TrialSettings

log = logging.getLogger(__name__)

MAINTENANCE_SECONDS = 30  # how often to look for trials of dead controllers


class SearchStopped(RuntimeError):
    """The search cannot go on (e.g. every trial fails); the message says why and what to do."""


@dataclass(frozen=True)
class Ticket:
    """One trial to run: the settings it trains with (to_dict/from_dict carry them to a worker), and whether a
    scheduler may stop it early: never a baseline (it is what every searched delta is compared with), a
    refinement (a few trials whose first epoch ranks rates poorly: refine.py) or a finalist (finalists.py); and
    whether it is a finalist (one a runner may train packed with others: search/packs.py)."""

    number: int
    settings: TrialSettings
    stoppable: bool
    finalist: bool = False


class Controller:
    """Asks the study for trials, draws what each trains and hands it to a runner as a Ticket; what the runner
    tells it, its recorder writes (`on_record`, `on_progress`: recorder.py). `clock`: the search's, on which its
    budget began."""

    def __init__(self, study: optuna.Study, plan: SearchPlan, on_record: Callable[[FrozenTrial], None] | None = None,
                 on_progress: Callable[[int, int, int, float | None], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.study = study
        self.plan = plan
        # what the baselines' head reads: as the study was made (a study from before it was recorded: the first token)
        self.baseline_pooling = read_study(study).baseline_pooling or "cls"
        self.owner = recovery.Owner.current()
        self.finalists = FinalistSchedule(plan, answers.maximizes(study), clock)  # the search's clock too
        self.recorder = TrialRecorder(study, plan.param_limit, clock, on_record, on_progress)
        self.requeued = 0  # interrupted trials of dead controllers queued again by this process
        self.portfolio_queued: list[str] = []  # portfolio members queued by this process
        self._last_maintenance = 0.0
        # refinements reshape the baselines; a portfolio already holds such reshaped configurations, learned
        # (and they were chosen on classification: a generation study has none)
        self._refinements_settled = not plan.baselines or plan.portfolio is not None or plan.generation
        # a portfolio whose rates are calibrated: its members are queued once the study's LoRA rate is known
        self._members_held = plan.portfolio is not None and plan.portfolio.calibrate \
            and CALIBRATION_BASELINE in plan.baselines
        # `--sampler leaders`: the best members again at other rates, once they have finished (leaders.py)
        self._leaders_settled = plan.portfolio is None or plan.options.sampler != "leaders"
        self._draws = leaders.draws(plan.options.sampler)  # False: the portfolio alone (`--sampler none`)

    # -- set-up ------------------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Fail and re-queue trials of dead controllers, then queue the baselines not run yet."""
        self._maintain(force=True)
        plan = self.plan
        queued = enqueue_missing(self.study, plan.baselines,
                                 lambda name: plan.space.params_for(baseline_spec(name, self.baseline_pooling),
                                                                    plan.num_layers))
        if plan.portfolio is not None:
            self._queue_members()
        return queued

    def _queue_members(self) -> str | None:
        """Queue the portfolio's members not queued yet, unless they wait for the study's LoRA rate (a calibrated
        portfolio); then WAIT while nothing else is queued to run first, so that no worker draws ahead of them."""
        if self._members_held:
            trials = self.study.get_trials(deepcopy=False)
            settled, _ = rate_policy.calibration(trials)
            if not settled:
                return WAIT if not any(t.state == TrialState.WAITING for t in trials) else None
            self._members_held = False
        members = self.plan.portfolio.members[: self.plan.portfolio_size]
        self.portfolio_queued += portfolio_phase.enqueue_missing(
            self.study, members, functools.partial(portfolio_phase.member_params, self.plan))
        return None

    # -- what to run next ---------------------------------------------------------------------------

    def time_left(self) -> float | None:
        return self.finalists.time_left()

    def next_trial(self) -> Ticket | str:
        """A Ticket, WAIT or DONE. Records refused and over-budget trials on the way."""
        if self.recorder.error or (self.time_left() is not None and self.time_left() <= 0):
            return DONE
        self._maintain()
        while True:
            budget = self.plan.budget.trials if isinstance(self.plan.budget, TrialBudget) else None
            if budget is not None:
                trials = self.study.get_trials(deepcopy=False)
                if claims.budget_spoken_for(trials, budget):
                    # an unmarked claim may be a killed controller's: wait until recovery can tell (its age)
                    return WAIT if self.recorder.running or recovery.unmarked(trials) else DONE
            self._queue_refinements(budget)
            self._queue_leaders(budget)
            more = self._draws or self._members_held or self._waiting()
            final = self.finalists.turn(self.study.get_trials(deepcopy=False), budget, bool(self.recorder.running),
                                        self._queue_finalists, more)
            if final in (WAIT, DONE):
                return final
            if self._members_held and self._queue_members() == WAIT:
                return WAIT
            if not self._draws and not final and not self._waiting():
                return WAIT if self.recorder.running else DONE  # the portfolio alone, and nothing queued is left
            if not self._leaders_settled and not final and not self._waiting():
                return WAIT  # the last members run: no worker draws ahead of the leaders' variants
            trial = self._ask()
            trials = self.study.get_trials(deepcopy=False)
            kind = record.kind_of(trial)
            finalist = kind is TrialKind.FINALIST
            if final == ASK and not finalist:  # queued before the finalists, and now too late
                self.recorder.fail(trial, claims.BUDGET_REACHED)
                continue
            limit = budget if finalist or budget is None else budget - self.finalists.trial_room(budget)
            if budget is not None and not claims.admitted(trial.number, trials, limit):
                self.recorder.fail(trial, claims.BUDGET_REACHED)
                return WAIT
            baseline = record.baseline_of(trial)
            if baseline and baselines.too_late(self.finalists.elapsed(), self.plan.deadline_seconds):
                self.recorder.fail(trial, claims.LATE_BASELINE)
                continue
            if not finalist and not self.finalists.ends_before_room(trial, trials):
                self.recorder.fail(trial, claims.BUDGET_REACHED)
                continue
            if baseline and claims.baseline_alive(baseline, trials, below=trial.number):
                self.recorder.fail(trial, claims.DUPLICATE_BASELINE)
                continue
            ticket = self._plan_trial(trial, kind, baseline)
            if ticket is not None:
                return ticket
            if self.recorder.error:
                return DONE

    def _queue_refinements(self, budget: int | None) -> None:
        """Once every baseline has finished, or has begun with two finished: the best two again, reshaped
        (refine.py), once per study; on a trial budget, at most half of what it leaves."""
        if self._refinements_settled:
            return
        trials = self.study.get_trials(deepcopy=False)
        if not refine.queued(trials):  # by no process yet
            if not refine.ready(trials, baselines.in_play(self.plan.baselines, trials)):
                return
            counts = claims.tally(trials)
            room = None if budget is None else \
                max(0, budget - self.finalists.trial_room(budget) - counts.trained - counts.running) // 2
            if refine.enqueue(self.study, trials, room):
                log.info("queued the best baselines again, in more places, at half the batch and at other rates")
            elif not refine.due(trials, baselines.in_play(self.plan.baselines, trials)):
                return  # none could be queued while a baseline runs: again once it has finished
        self._refinements_settled = True

    def _queue_leaders(self, budget: int | None) -> None:
        """Once every portfolio member has finished: the leading members at other rates (leaders.py), once per
        study; on a trial budget, at most what it leaves besides the finalists' room."""
        if self._leaders_settled:
            return
        trials = self.study.get_trials(deepcopy=False)
        if not leaders.queued(trials) and not finalists.queued(trials):  # by no process yet; not after the end
            if not leaders.due(trials):
                return
            counts = claims.tally(trials)
            room = None if budget is None else \
                max(0, budget - self.finalists.trial_room(budget) - counts.trained - counts.running)
            queued = leaders.enqueue(self.study, trials, room)
            wanted = leaders.BEST * len(leaders.FACTORS)
            if queued:
                log.info("queued the portfolio's leaders again at other rates" +
                         (f" ({queued} of {wanted}: the budget holds no more)" if queued < wanted else ""))
            else:
                log.info("the budget holds none of the portfolio's leaders again at other rates")
        self._leaders_settled = True

    def _waiting(self) -> bool:
        return any(t.state == TrialState.WAITING for t in self.study.get_trials(deepcopy=False))

    def _queue_finalists(self, count: int) -> bool:
        """Queue the best `count` trials again with the finalists' seed (finalists.py); whether any was."""
        seed = finalists.seed_for(self.plan.options.seed)
        if not finalists.enqueue(self.study, self.study.get_trials(deepcopy=False), count, seed):
            return False
        log.info("queued the best trials again with seed %d", seed)
        return True

    def _ask(self) -> optuna.Trial:
        with warnings.catch_warnings():  # heartbeats are ours to record, not Study.optimize's
            warnings.simplefilter("ignore")
            trial = self.study.ask()
        record.write(trial, record.attrs(controller=self.owner.to_attr()))
        optuna_private.storage_of(self.study).record_heartbeat(optuna_private.trial_id(trial))
        return trial

    def _plan_trial(self, trial: optuna.Trial, kind: TrialKind, baseline: str | None) -> Ticket | None:
        """Draw and size the delta; a Ticket, or None when it was refused (recorded as FAIL)."""
        from autopelt.delta import count_parameters, parse_spec  # torch: the driver's, never a Ray worker's

        plan = self.plan
        try:
            drawn, rate = draw_trial(plan, self.study, trial, kind, baseline, self.baseline_pooling)
            record.write(trial, record.attrs(lr_from=rate.lr_from))
            spec = parse_spec(drawn)
            count = count_parameters(spec, plan.model_config, plan.num_labels, lm=plan.generation)
        except UserError as error:
            self.recorder.refuse(trial, f"invalid delta: {error}")
            return None
        excess = plan.param_limit.excess(count.stored, count.base) if plan.param_limit else None
        if excess:
            record.write(trial, record.sized(spec.to_dict(), spec.summary(), count))
            self.recorder.refuse(trial, f"over parameter budget: {excess}")
            return None
        max_fidelity = int(plan.options.epochs or rate.hparams.get("epochs") or plan.epochs)
        hparams = {**rate.hparams, "epochs": max_fidelity, **plan.trial_shape}  # recorded as it trains
        seed = record.finalist_of(trial).get("seed")
        # test is scored where it is read (answer_scores.py): as it trains for a baseline or a finalist's re-run
        # (the summary sets them beside the answer), after the search for the answer, never for the rest
        settings = plan.trial_settings(spec.to_dict(), hparams, plan.out_dir / f"trial-{trial.number:05d}",
                                       seed=seed if isinstance(seed, int) else None,
                                       score_test=kind in (TrialKind.BASELINE, TrialKind.FINALIST))
        record.write(trial, record.planned(settings.spec, spec.summary(), count, max_fidelity, settings.out_dir,
                                           hparams))
        self.recorder.start(trial, max_fidelity, 100.0 * count.stored / count.base)
        # the portfolio's first is the prior's favourite; a leader's variant measures a rate (leaders.py)
        stoppable = kind in (TrialKind.DRAWN, TrialKind.MEMBER) \
            and record.portfolio_of(trial).get("rank") != 0 and not leaders.is_variant(trial)
        return Ticket(trial.number, settings, stoppable=stoppable, finalist=kind is TrialKind.FINALIST)

    # -- what happened ----------------------------------------------------------------------------------

    def report(self, number: int, event: dict) -> None:
        """One evaluation during training: {"epoch": int, "dev_metric": float, ...}."""
        self.recorder.report(number, event)

    def finish(self, number: int, result: dict) -> None:
        """The trial returned its result (docs/design.md), failed or not."""
        self.recorder.finish(number, result)

    def crash(self, number: int, reason: str) -> None:
        """The trial's process died (errors of run_trial itself arrive through `finish`, as failed results)."""
        self.recorder.crash(number, reason)

    def interrupt(self, number: int) -> None:
        """The trial will not run on (its worker never took it): FAIL as interrupted and queued again."""
        if number in self.recorder.running:
            self.recorder.interrupt(number)

    def superseded(self, number: int) -> bool:
        """Whether to stop a running trial now, at its latest report, to free its worker for the finalists
        (schedule.FinalistSchedule.supersedes)."""
        run = self.recorder.running.get(number)
        return run is not None and self.finalists.supersedes(number, run.trial, run.fidelity, run.max_fidelity)

    def stop_early(self, number: int, why: str = "early stopping") -> None:
        """The scheduler (or the deadline) stopped the trial after its last report: PRUNED at that fidelity."""
        self.recorder.stop(number, record.FOR_FINALISTS if number in self.finalists.superseded else why)

    def close(self) -> None:
        """Record what is still running when the runner returns: stopped by the deadline, or interrupted."""
        time_up = self.time_left() is not None and self.time_left() <= 0
        for number, run in list(self.recorder.running.items()):
            if time_up and run.fidelity > 0:
                self.stop_early(number, record.TIME_BUDGET)
            else:
                self.recorder.interrupt(number)

    def _maintain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_maintenance < MAINTENANCE_SECONDS:
            return
        self._last_maintenance = now
        for trial in recovery.interrupted_trials(self.study, own=self.recorder.running):
            self.requeued += recovery.fail_and_requeue(self.study, trial)
