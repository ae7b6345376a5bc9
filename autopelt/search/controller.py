"""The controller: the one place that writes the study. Runners (Ray Tune) ask it what to train and tell it
what happened; it never trains anything itself.

A trial's way through it: ask -> claim (exact trial budget, claims.py) -> draw a delta from the space, or
the preset of a queued baseline, or a finalist's own delta (confirm.py) -> count its parameters and refuse it
if over --max-params (FAIL, draw again: over-budget deltas never cost compute) -> its TrialSettings, built
here and nowhere else, in a Ticket for the runner -> report per evaluation (intermediate values) -> finish
(COMPLETE / FAIL), stop_early (PRUNED), or crash (FAIL). What it writes is the study record of autopelt/study/record.py.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autopelt.delta.presets import PRESETS
from autopelt.errors import UserError
from autopelt.numbers import is_finite_number
from autopelt.portfolio.portfolio import CALIBRATION_BASELINE
from autopelt.search import baselines, claims, confirm, portfolio_phase, rate_policy, recovery, refine
from autopelt.search.baselines import baseline_hparams, baseline_spec, enqueue_missing
from autopelt.search.budget import TrialBudget
from autopelt.search.plan import SearchPlan
from autopelt.search.schedule import ASK, DONE, WAIT, FinalistSchedule
from autopelt.study import answers, optuna_private, record
from autopelt.study.record import TrialKind
from autopelt.train.settings import TrialSettings

log = logging.getLogger(__name__)

MAX_REJECTIONS_IN_ROW = 100  # deltas over --max-params drawn one after another before the search gives up
MAX_FAILURES_IN_ROW = 10  # trials failing one after another before the search gives up
MAINTENANCE_SECONDS = 30  # how often to look for trials of dead controllers


class SearchStopped(RuntimeError):
    """The search cannot go on (e.g. every trial fails); the message says why and what to do."""


@dataclass(frozen=True)
class Ticket:
    """One trial to run: the settings it trains with (to_dict/from_dict carry them to a worker), and whether a
    scheduler may stop it early: never a baseline (it is what every searched delta is compared with), a
    refinement (a few trials whose first epoch ranks rates poorly: refine.py) or a finalist (confirm.py)."""

    number: int
    settings: TrialSettings
    stoppable: bool




@dataclass
class _Running:
    trial: optuna.Trial
    max_fidelity: int
    params_pct: float
    started: float  # on the search's clock
    fidelity: int = 0
    intermediate: dict[int, float] = field(default_factory=dict)


class Controller:
    def __init__(self, study: optuna.Study, plan: SearchPlan, on_record: Callable[[FrozenTrial], None] | None = None,
                 on_progress: Callable[[int, int, int, float | None], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.study = study
        self.plan = plan
        # what the baselines' head reads: as the study was made (a study from before it was recorded: the first token)
        self.baseline_pooling = record.read_study(study).baseline_pooling or "cls"
        self.owner = recovery.Owner.current()
        self.on_record = on_record or (lambda trial: None)
        self.on_progress = on_progress or (lambda *event: None)  # (trial, epoch, of epochs, dev metric)
        self.running: dict[int, _Running] = {}
        self.finalists = FinalistSchedule(plan, answers.maximizes(study), clock)  # the search's clock too
        self.rejected = 0  # over --max-params, this process
        self.requeued = 0  # interrupted trials of dead controllers queued again by this process
        self.portfolio_queued: list[str] = []  # portfolio members queued by this process
        self.finished: list[FrozenTrial] = []  # trained trials this process recorded
        self.error: str | None = None
        self._rejections_in_row = 0
        self._failures_in_row = 0
        self._last_maintenance = 0.0
        self._multi = len(study.directions) > 1
        # refinements reshape the baselines; a portfolio already holds such reshaped configurations, learned
        # (and they were chosen on classification: a generation study has none)
        self._refinements_settled = not plan.baselines or plan.portfolio is not None or plan.generation
        # a portfolio whose rates are calibrated: its members are queued once the study's LoRA rate is known
        self._members_held = plan.portfolio is not None and plan.portfolio.calibrate \
            and CALIBRATION_BASELINE in plan.baselines

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
        self.portfolio_queued += portfolio_phase.enqueue_missing(self.study, members, self._member_params)
        return None

    def _member_params(self, member) -> dict | None:
        """The space's parameters that draw a portfolio member (so the sampler learns from it), or None."""
        params = self.plan.space.params_for(member.spec(self.plan.num_layers), self.plan.num_layers)
        if params is not None and "batch_size" in params:
            params["batch_size"] = member.batch_size
        return params

    def running_trial_ids(self) -> list[int]:
        return [optuna_private.trial_id(run.trial) for run in list(self.running.values())]

    # -- what to run next ---------------------------------------------------------------------------

    def time_left(self) -> float | None:
        return self.finalists.time_left()

    def next_trial(self) -> Ticket | str:
        """A Ticket, WAIT or DONE. Records refused and over-budget trials on the way."""
        if self.error or (self.time_left() is not None and self.time_left() <= 0):
            return DONE
        self._maintain()
        while True:
            budget = self.plan.budget.trials if isinstance(self.plan.budget, TrialBudget) else None
            if budget is not None:
                trials = self.study.get_trials(deepcopy=False)
                if claims.budget_spoken_for(trials, budget):
                    # an unmarked claim may be a killed controller's: wait until recovery can tell (its age)
                    return WAIT if self.running or recovery.unmarked(trials) else DONE
            self._queue_refinements(budget)
            final = self.finalists.turn(self.study.get_trials(deepcopy=False), budget, bool(self.running),
                                        self._queue_finalists)
            if final in (WAIT, DONE):
                return final
            if self._members_held and self._queue_members() == WAIT:
                return WAIT
            trial = self._ask()
            trials = self.study.get_trials(deepcopy=False)
            kind = record.kind_of(trial)
            finalist = kind is TrialKind.FINALIST
            if final == ASK and not finalist:  # queued before the finalists, and now too late
                self._fail(trial, claims.BUDGET_REACHED)
                continue
            limit = budget if finalist or budget is None else budget - self.finalists.trial_room(budget)
            if budget is not None and not claims.admitted(trial.number, trials, limit):
                self._fail(trial, claims.BUDGET_REACHED)
                return WAIT
            baseline = record.baseline_of(trial)
            if baseline and baselines.too_late(self.finalists.elapsed(), self.plan.deadline_seconds):
                self._fail(trial, claims.LATE_BASELINE)
                continue
            if not finalist and not self.finalists.ends_before_room(trial, trials):
                self._fail(trial, claims.BUDGET_REACHED)
                continue
            if baseline and claims.baseline_alive(baseline, trials, below=trial.number):
                self._fail(trial, claims.DUPLICATE_BASELINE)
                continue
            ticket = self._plan_trial(trial, kind, baseline)
            if ticket is not None:
                return ticket
            if self.error:
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

    def _queue_finalists(self, count: int) -> bool:
        """Queue the best `count` trials again with the finalists' seed (confirm.py); whether any was."""
        seed = confirm.seed_for(self.plan.options.seed)
        if not confirm.enqueue(self.study, self.study.get_trials(deepcopy=False), count, seed):
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
            drawn, hparams = self._draw(trial, kind, baseline)
            spec = parse_spec(drawn)
            count = count_parameters(spec, plan.model_config, plan.num_labels, lm=plan.generation)
        except UserError as error:
            self._reject(trial, f"invalid delta: {error}")
            return None
        excess = plan.param_limit.excess(count.stored, count.base) if plan.param_limit else None
        if excess:
            record.write(trial, record.sized(spec.to_dict(), spec.summary(), count))
            self._reject(trial, f"over parameter budget: {excess}")
            return None
        self._rejections_in_row = 0
        max_fidelity = int(plan.options.epochs or hparams.get("epochs") or plan.epochs)
        hparams = {**hparams, "epochs": max_fidelity}
        seed = record.confirms(trial).get("seed")
        # test is scored where it is read (answer_scores.py): as it trains for a baseline or a finalist's re-run
        # (the summary sets them beside the answer), after the search for the answer, never for the rest
        settings = self.trial_settings(spec.to_dict(), hparams, plan.out_dir / f"trial-{trial.number:05d}",
                                       seed=seed if isinstance(seed, int) else None,
                                       score_test=kind in (TrialKind.BASELINE, TrialKind.FINALIST))
        record.write(trial, record.planned(settings.spec, spec.summary(), count, max_fidelity, settings.out_dir,
                                           hparams))
        self.running[trial.number] = _Running(trial, max_fidelity, 100.0 * count.stored / count.base,
                                              started=self.finalists.clock())
        stoppable = kind in (TrialKind.DRAWN, TrialKind.MEMBER) \
            and record.portfolio_of(trial).get("rank") != 0  # the portfolio's first is the prior's favourite
        return Ticket(trial.number, settings, stoppable=stoppable)

    def _draw(self, trial: optuna.Trial, kind: TrialKind, baseline: str | None) -> tuple[dict, dict]:
        """(spec, hparams) of the trial: its delta from its source (by its kind), at the rate rate_policy decides,
        which the trial records (`lr_from`)."""
        repeats = None
        if kind is TrialKind.FINALIST:
            again = record.confirms(trial)["trial"]
            original = next((t for t in self.study.get_trials(deepcopy=False) if t.number == again), None)
            if original is None:
                raise UserError(f"trial {again}, queued as a finalist, is not in the study")
            original = record.read(original)
            (spec, hparams), repeats = confirm.settings_of(original), original.learning_rate
        elif kind is TrialKind.MEMBER:
            if record.portfolio_of(trial).get("drawn"):  # queued with the parameters that draw it: record them
                self.plan.space.sample(trial, self.plan.num_layers)
            spec, hparams = portfolio_phase.spec_and_hparams(self.plan, record.portfolio_of(trial))
        elif kind is TrialKind.BASELINE:
            if baseline not in PRESETS:
                raise UserError(f"unknown baseline {baseline!r}")
            if record.is_drawn_baseline(trial):  # queued with the parameters that draw it: record them
                self.plan.space.sample(trial, self.plan.num_layers)
            spec, hparams = baseline_spec(baseline, self.baseline_pooling), baseline_hparams(self.plan.epochs)
        else:
            spec, hparams = self.plan.space.sample(trial, self.plan.num_layers)
        rate = rate_policy.decide(kind, hparams, trials=self.study.get_trials(deepcopy=False),
                                  portfolio=self.plan.portfolio, spec=spec, baseline=baseline, repeats=repeats)
        record.write(trial, record.attrs(lr_from=rate.lr_from))
        return spec, rate.hparams

    def trial_settings(self, spec: dict, hparams: dict, out_dir, seed: int | None = None,
                       score_test: bool = True) -> TrialSettings:
        """Everything a trial of this search trains with: the study's task, model, data and seed (a finalist's
        own `seed`), the delta, and the training hyper-parameters drawn for it (names of TrialSettings). The
        train/dev rows come from the study's seed (`data_seed`), so every trial sees the same ones."""
        plan = self.plan
        return TrialSettings(
            task=plan.task, spec=spec, custom_task=plan.options.custom_task, model=plan.model, data_dir=plan.data_dir,
            protocol=plan.options.k or "full", seed=plan.options.seed if seed is None else seed,
            data_seed=plan.options.seed,
            precision=plan.options.precision, out_dir=str(out_dir), score_test=score_test,
            keep_predictions=not plan.generation,  # the ensemble is selected from them (autopelt/ensemble)
            gradient_checkpointing=self._checkpointing(spec),
            **{"backbone_dropout": plan.options.backbone_dropout, **hparams},
        )

    def _checkpointing(self, spec: dict) -> bool:
        """--gradient-checkpointing for every trial whose delta can take it (the others train without it)."""
        if not self.plan.options.gradient_checkpointing:
            return False
        from autopelt.train.backbone import checkpointing_refusal

        return checkpointing_refusal(self.plan.model_config, spec) is None

    def _reject(self, trial: optuna.Trial, reason: str) -> None:
        self.rejected += 1
        self._rejections_in_row += 1
        self._fail(trial, reason)
        if self._rejections_in_row >= MAX_REJECTIONS_IN_ROW:
            limit = f" --max-params {self.plan.param_limit}" if self.plan.param_limit else ""
            self.error = (
                f"{MAX_REJECTIONS_IN_ROW} deltas in a row were refused{limit} (last: {reason}); "
                "allow more parameters or use a space with smaller deltas"
            )

    # -- what happened --------------------------------------------------------------------------------

    def report(self, number: int, event: dict) -> None:
        """One evaluation during training: {"epoch": int, "dev_metric": float, ...}."""
        run = self.running.get(number)
        epoch = int(event.get("epoch") or 0)
        if run is None or epoch <= run.fidelity:
            return
        run.fidelity = epoch
        value = event.get("dev_metric")
        value = float(value) if is_finite_number(value) else None
        if value is not None:
            run.intermediate[epoch] = value
        self.on_progress(number, epoch, run.max_fidelity, value)
        try:
            if not self._multi and value is not None:  # Optuna keeps intermediate values of single objectives
                run.trial.report(value, step=epoch)
            record.write(run.trial, record.attrs(fidelity=epoch))
        except UpdateFinishedTrialError:  # failed as interrupted by another process meanwhile
            pass

    def finish(self, number: int, result: dict) -> None:
        """The trial returned its result (docs/design.md), failed or not."""
        run = self.running.pop(number, None)
        if run is None:
            return
        attrs = record.trained(result, run.fidelity, run.max_fidelity)
        reason = record.failure_reason(result)
        if reason:
            self._record(run, TrialState.FAIL, {**attrs, **record.attrs(full_fidelity=False, fail_reason=reason)},
                         reason=reason)
            return
        values = record.objective_values(result, run.params_pct, self._multi)
        self._record(run, TrialState.COMPLETE, attrs, values)

    def superseded(self, number: int) -> bool:
        """Whether to stop a running trial now, at its latest report, to free its worker for the finalists
        (schedule.FinalistSchedule.supersedes)."""
        run = self.running.get(number)
        return run is not None and self.finalists.supersedes(number, run.trial, run.fidelity, run.max_fidelity)

    def stop_early(self, number: int, why: str = "early stopping") -> None:
        """The scheduler (or the deadline) stopped the trial after its last report: PRUNED at that fidelity."""
        run = self.running.pop(number, None)
        if run is not None:
            why = record.FOR_FINALISTS if number in self.finalists.superseded else why
            self._record(run, TrialState.PRUNED, record.stopped(run.fidelity, why))

    def crash(self, number: int, reason: str) -> None:
        """The trial's process died (errors of run_trial itself arrive through `finish`, as failed results)."""
        run = self.running.pop(number, None)
        if run is not None:
            attrs = record.attrs(fidelity=run.fidelity, full_fidelity=False, fail_reason=reason)
            self._record(run, TrialState.FAIL, attrs, reason=reason)

    def close(self) -> None:
        """Record what is still running when the runner returns: stopped by the deadline, or interrupted."""
        time_up = self.time_left() is not None and self.time_left() <= 0
        for number, run in list(self.running.items()):
            if time_up and run.fidelity > 0:
                self.stop_early(number, record.TIME_BUDGET)
                continue
            self.running.pop(number)
            try:
                record.write(run.trial, record.attrs(fidelity=run.fidelity))
            except UpdateFinishedTrialError:
                continue
            recovery.fail_and_requeue(
                self.study, optuna_private.storage_of(self.study).get_trial(optuna_private.trial_id(run.trial)))

    # -- writing ----------------------------------------------------------------------------------------

    def _record(self, run: _Running, state: TrialState, attrs: dict, values: list[float] | None = None,
                reason: str | None = None) -> None:
        trial = run.trial
        if self._multi and run.intermediate:
            attrs = {**attrs, **record.intermediate_values(run.intermediate)}
        attrs = {**attrs, **record.attrs(seconds=round(self.finalists.clock() - run.started, 3))}
        try:
            record.write(trial, attrs)
            frozen = self.study.tell(trial, values, state=state)
        except UpdateFinishedTrialError:
            log.warning("trial %d was declared interrupted by another process; its result is dropped", trial.number)
            return
        self._count_outcome(state, reason)
        if state in claims.TRAINED:
            self.finished.append(frozen)
        self.on_record(frozen)

    def _count_outcome(self, state: TrialState, reason: str | None) -> None:
        if state != TrialState.FAIL:
            self._failures_in_row = 0
            return
        self._failures_in_row += 1
        if self._failures_in_row >= MAX_FAILURES_IN_ROW:
            self.error = (
                f"{MAX_FAILURES_IN_ROW} trials in a row failed (last: {reason}); "
                "fix the cause and run the same command again to resume"
            )

    def _fail(self, trial: optuna.Trial, reason: str) -> None:
        record.write(trial, record.failed(reason))
        self.study.tell(trial, state=TrialState.FAIL)

    def _maintain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_maintenance < MAINTENANCE_SECONDS:
            return
        self._last_maintenance = now
        for trial in recovery.interrupted_trials(self.study, own=self.running):
            self.requeued += recovery.fail_and_requeue(self.study, trial)
