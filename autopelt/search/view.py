"""What the user sees while the search runs: the plan in a few lines, then one line per finished trial (and one per
epoch of a running one) with the best so far and the time left.

Built from the study's records (autopelt/study/record.py), so it shows the same thing whichever process recorded a
trial, and names the same best trial as export and the report (autopelt/study/answers.py). The end's summary is
summary.py.
"""

from __future__ import annotations

import time
from typing import Callable

import optuna
from optuna.trial import FrozenTrial

from autopelt.models import model_name
from autopelt.search import finalists
from autopelt.search.budget import TrialBudget, format_duration
from autopelt.search.claims import TRAINED
from autopelt.search.plan import SearchPlan
from autopelt.search.trial_text import SUMMARY_WIDTH, delta_text, outcome_text, params_text
from autopelt.study import answers
from autopelt.study.record import read, read_all
from autopelt.study.storage import hide_password


class LiveView:
    """Prints a line for each trial this process records (trained or failed; refusals are counted)."""

    def __init__(self, study: optuna.Study, plan: SearchPlan, echo: Callable[[str], None] = print):
        self.study, self.plan, self.echo = study, plan, echo
        self.started = time.monotonic()
        self.mine = 0  # trained trials this process recorded
        self.partial: dict[int, float] = {}  # running trials of this process: the share of their epochs done

    def header(self, queued_baselines: list[str], requeued: int, queued_portfolio: list[str] = ()) -> None:
        plan = self.plan
        workers = f"{plan.options.workers} worker{'s' if plan.options.workers > 1 else ''}"
        self.echo(f"study {plan.study_name} in {hide_password(plan.storage)}: {plan.task}, {model_name(plan.model)}, "
                  f"space {plan.space.name}, budget {plan.budget}, {workers}")
        if plan.data is not None:
            self.echo(plan.data.line())
            if plan.data.warning():
                self.echo(plan.data.warning())
        done = sum(t.state in TRAINED for t in self.study.get_trials(deepcopy=False))
        if done or requeued:
            self.echo(f"resuming: {done} trained trial(s) kept, {requeued} interrupted trial(s) queued again")
        if queued_baselines:
            self.echo(f"baselines queued: {', '.join(queued_baselines)} — each keeps its paper structure and "
                      f"{_baseline_rates(plan, queued_baselines)}")
        final = f" + {plan.finalists} finalists" if plan.finalists else ""
        if plan.portfolio_note:
            self.echo(plan.portfolio_note)
        if plan.gpu_note:
            self.echo(plan.gpu_note)
        if queued_portfolio:
            self.echo(f"portfolio queued: {', '.join(queued_portfolio)} — each at the rate, batch and backbone dropout "
                      f"it was measured with")
        elif plan.portfolio is not None and plan.portfolio.calibrate and plan.portfolio_size:
            self.echo(f"portfolio: its first {plan.portfolio_size} configuration(s) queued once the lora baseline's "
                      "rate is known (their rates are calibrated to it)")
        if plan.fit_note:
            self.echo(plan.fit_note)
        if plan.portfolio is not None:
            self.echo(f"budget: {_portfolio_plan(plan)}{final}")
        elif isinstance(plan.budget, TrialBudget) and plan.baselines:
            searched = max(plan.budget.trials - len(plan.baselines) - plan.finalists, 0)
            self.echo(f"budget: {len(plan.baselines)} baseline trials + {searched} searched deltas{final}; searched "
                      f"deltas train at the rates the baselines chose for their methods, times a drawn lr_scale")
        elif plan.baselines:
            self.echo("budget: baselines start in its first half; what they leave goes to the best of them refined, "
                      "searched deltas (at the rates the baselines chose, times a drawn lr_scale) and the finalists")
        if plan.finalists:
            best = f"the best {plan.finalists} trials" if isinstance(plan.budget, TrialBudget) else \
                f"the best {plan.finalists} trials, or the rounds that fit in a third of what the baselines leave,"
            self.echo(f"at the end: {best} again with seed {finalists.seed_for(plan.options.seed)}, inside the "
                      f"budget; the best mean dev answers")
        self.echo(f"{'trial':>6}  {'delta':<{SUMMARY_WIDTH}} {'params':>8}  {plan.dev_heading[:14]:<14} "
                  f"{'best so far':<18} elapsed / ETA")

    def on_record(self, trial: FrozenTrial) -> None:
        self.partial.pop(trial.number, None)
        if trial.state in TRAINED:
            self.mine += 1
        record = read(trial)
        self._line(record.number, delta_text(record), params_text(record), outcome_text(record))

    def on_progress(self, number: int, epoch: int, epochs: int, value: float | None) -> None:
        """An epoch of a running trial, so a long trial is not silence (the final line comes from on_record)."""
        self.partial[number] = epoch / max(epochs, 1)
        if epoch < epochs:
            self._line(number, f"… epoch {epoch}/{epochs}", "", f"{value:.4f}" if value is not None else "-")

    def _line(self, number: int, delta: str, pct: str, outcome: str) -> None:
        elapsed = time.monotonic() - self.started
        self.echo(f"{'#' + str(number):>6}  {delta:<{SUMMARY_WIDTH}} {pct:>8}  "
                  f"{outcome:<14} {self._best():<18} {format_duration(elapsed)} / {self._eta(elapsed)}")

    def _best(self) -> str:
        trials = read_all(self.study)
        best = answers.best(trials)
        return f"{answers.dev_score(best, answers.seed_devs(trials)):.4f} (#{best.number})" if best else "-"

    def _eta(self, elapsed: float) -> str:
        budget = self.plan.budget
        if not isinstance(budget, TrialBudget):
            return format_duration(max(budget.seconds - elapsed, 0))
        done = sum(t.state in TRAINED for t in self.study.get_trials(deepcopy=False))
        left = max(budget.trials - done, 0)
        if not left:
            return "0s"
        # trials' worth of work this process did, the epochs of its running trials counted: an ETA from the first
        # epoch on, not only after the first trial
        worth = self.mine + sum(self.partial.values())
        return format_duration(elapsed / worth * (left - sum(self.partial.values()))) if worth else "?"


def _baseline_rates(plan: SearchPlan, names: list[str]) -> str:
    """How the queued baselines come by their learning rates, in words."""
    if plan.generation:
        return "chooses its learning rate by a sweep of dev loss after one epoch, about 1.5-2 trials of compute"
    learned = plan.portfolio.baseline_rates if plan.portfolio is not None else {}
    if plan.portfolio is not None and plan.portfolio.calibrate:
        return ("lora sweeps its learning rate, about 1.5-2 trials of compute: the calibration" +
                (", the others train at the rate learned with the portfolio, calibrated like its members"
                 if any(name in (learned or {}) for name in names) else ""))
    if names and all(name in (learned or {}) for name in names):
        return "trains at the rate learned with the portfolio"
    return "chooses its learning rate by a sweep, about 1.5-2 trials of compute"


def _portfolio_plan(plan: SearchPlan) -> str:
    """What a budget with a portfolio runs, in words: only what it will run."""
    base = f"{len(plan.baselines)} baseline(s), then " if plan.baselines else ""
    if isinstance(plan.budget, TrialBudget):
        left = plan.budget.trials - len(plan.baselines) - plan.portfolio_size
        first = "the portfolio's first configuration" if plan.portfolio_size == 1 else \
            f"the portfolio's first {plan.portfolio_size} configurations (early stopping halves them; the first " \
            f"trains to the end)"
        return f"{base}{first}" + (_then(plan) if left > plan.finalists else "")
    rest = f", then as many of its next {plan.portfolio_size - 1} as the time allows (early stopping halves " \
        f"them)" if plan.portfolio_size > 1 else ""
    return f"{base}the portfolio's first configuration (to the end){rest}{_then(plan)}"


def _then(plan: SearchPlan) -> str:
    """What draws after the portfolio (`--sampler`, search/leaders.py), in words."""
    sampler = plan.options.sampler
    if sampler == "none":
        return ""
    if sampler == "leaders":
        return ", then the two best of them at half and twice their rate, then the sampler"
    return ", then the sampler"
