"""What becomes of the trials one search process runs, written to the study as the runner tells it: each
evaluation, the result, a stop, a crash, an interruption; and the trials refused before they train. The
controller's hand (controller.py): the runner's events reach it through the controller, and it writes only through
autopelt/study/record.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autopelt.numbers import is_finite_number
from autopelt.search import claims, recovery
from autopelt.search.budget import ParamLimit
from autopelt.study import optuna_private, record

log = logging.getLogger(__name__)

MAX_REJECTIONS_IN_ROW = 100  # deltas over --max-params drawn one after another before the search gives up
MAX_FAILURES_IN_ROW = 10  # trials failing one after another before the search gives up


@dataclass
class Running:
    trial: optuna.Trial
    max_fidelity: int
    params_pct: float
    started: float  # on the search's clock
    fidelity: int = 0
    intermediate: dict[int, float] = field(default_factory=dict)


class TrialRecorder:
    """The trials this process runs (`running`, by number) and what became of them. `clock`: the search's (a
    trial's `seconds`); `on_record(frozen)` is called once a trial is recorded, `on_progress(number, epoch, epochs,
    dev metric)` at each evaluation. `error` says why the search cannot go on (too many failures, or refused
    deltas, in a row); None while it can."""

    def __init__(self, study: optuna.Study, param_limit: ParamLimit | None, clock: Callable[[], float],
                 on_record: Callable[[FrozenTrial], None] | None = None,
                 on_progress: Callable[[int, int, int, float | None], None] | None = None):
        self.study = study
        self.param_limit = param_limit
        self.clock = clock
        self.on_record = on_record or (lambda trial: None)
        self.on_progress = on_progress or (lambda *event: None)
        self.running: dict[int, Running] = {}
        self.finished: list[FrozenTrial] = []  # trained trials this process recorded
        self.rejected = 0  # over --max-params, this process
        self.error: str | None = None
        self._rejections_in_row = 0
        self._failures_in_row = 0
        self._multi = len(study.directions) > 1

    def running_trial_ids(self) -> list[int]:
        return [optuna_private.trial_id(run.trial) for run in list(self.running.values())]

    def start(self, trial: optuna.Trial, max_fidelity: int, params_pct: float) -> None:
        """A trial handed to the runner, now."""
        self._rejections_in_row = 0
        self.running[trial.number] = Running(trial, max_fidelity, params_pct, started=self.clock())

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

    def stop(self, number: int, why: str) -> None:
        """Stopped after its last report (`why`: record.stopped): PRUNED at that fidelity."""
        run = self.running.pop(number, None)
        if run is not None:
            self._record(run, TrialState.PRUNED, record.stopped(run.fidelity, why))

    def crash(self, number: int, reason: str) -> None:
        """The trial's process died (errors of run_trial itself arrive through `finish`, as failed results)."""
        run = self.running.pop(number, None)
        if run is not None:
            attrs = record.attrs(fidelity=run.fidelity, full_fidelity=False, fail_reason=reason)
            self._record(run, TrialState.FAIL, attrs, reason=reason)

    def interrupt(self, number: int) -> None:
        """The runner returned while the trial ran: FAIL as interrupted and queued again (recovery.py), at the
        fidelity it reached."""
        run = self.running.pop(number)
        try:
            record.write(run.trial, record.attrs(fidelity=run.fidelity))
        except UpdateFinishedTrialError:
            return
        recovery.fail_and_requeue(
            self.study, optuna_private.storage_of(self.study).get_trial(optuna_private.trial_id(run.trial)))

    def refuse(self, trial: optuna.Trial, reason: str) -> None:
        """A drawn delta refused before training (invalid, or over --max-params): FAIL, never trained."""
        self.rejected += 1
        self._rejections_in_row += 1
        self.fail(trial, reason)
        if self._rejections_in_row >= MAX_REJECTIONS_IN_ROW:
            limit = f" --max-params {self.param_limit}" if self.param_limit else ""
            self.error = (
                f"{MAX_REJECTIONS_IN_ROW} deltas in a row were refused{limit} (last: {reason}); "
                "allow more parameters or use a space with smaller deltas"
            )

    def fail(self, trial: optuna.Trial, reason: str) -> None:
        """A trial that will not run (`reason`: one of claims' or a refusal's): FAIL."""
        record.write(trial, record.failed(reason))
        self.study.tell(trial, state=TrialState.FAIL)

    def _record(self, run: Running, state: TrialState, attrs: dict, values: list[float] | None = None,
                reason: str | None = None) -> None:
        trial = run.trial
        if self._multi and run.intermediate:
            attrs = {**attrs, **record.intermediate_values(run.intermediate)}
        attrs = {**attrs, **record.attrs(seconds=round(self.clock() - run.started, 3))}
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
