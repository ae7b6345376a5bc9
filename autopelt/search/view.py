"""What the user sees: one line per finished trial while the search runs, and a summary at the end.

Both are built from the study's records (autopelt/study/record.py), so they show the same thing whichever
process recorded a trial, and name the same best trial as export and the report (autopelt/study/answers.py).
"""

from __future__ import annotations

import shlex
import time
from typing import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autopelt.models import model_name
from autopelt.search import confirm
from autopelt.search.budget import TrialBudget, format_duration
from autopelt.search.claims import LATE_BASELINE, NOT_DONE_REASONS, TRAINED
from autopelt.search.plan import SearchPlan
from autopelt.study import answers
from autopelt.study.record import FOR_FINALISTS, TIME_BUDGET, TrialRecord, read, read_all
from autopelt.study.storage import DEFAULT_STORAGE, hide_password

SUMMARY_WIDTH = 34


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
            self.echo(f"at the end: {best} again with seed {confirm.seed_for(plan.options.seed)}, inside the "
                      f"budget; the best mean dev answers")
        self.echo(f"{'trial':>6}  {'delta':<{SUMMARY_WIDTH}} {'params':>8}  {plan.dev_heading[:14]:<14} "
                  f"{'best so far':<18} elapsed / ETA")

    def on_record(self, trial: FrozenTrial) -> None:
        self.partial.pop(trial.number, None)
        if trial.state in TRAINED:
            self.mine += 1
        record = read(trial)
        self._line(record.number, _summary(record), _pct(record), _outcome(record))

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


def summary_lines(study: optuna.Study, plan: SearchPlan, seconds: float, rejected: int = 0,
                  ensemble=None) -> list[str]:
    """What a search prints at its end; `ensemble` the study's (SearchOutcome.ensemble), chosen before."""
    trials = read_all(study)
    count = {state: sum(t.state == state for t in trials) for state in TrialState}
    failed = [t for t in trials if t.state == TrialState.FAIL and _reason(t) not in NOT_DONE_REASONS
              and not _reason(t).startswith("over parameter budget")]
    lines = [
        "",
        f"study {plan.study_name}: {count[TrialState.COMPLETE]} complete, {count[TrialState.PRUNED]} stopped "
        f"early, {len(failed)} failed ({format_duration(seconds)} in this run)",
    ]
    if rejected:
        lines.append(f"{rejected} delta(s) over --max-params {plan.param_limit} were recorded as FAIL, never trained")
    best = answers.best(trials)
    devs = answers.seed_devs(trials)
    lines.append(f"best: {_trial_text(best, plan, devs)}" if best else "best: no trial completed yet")
    lines += floor_lines(study, trials, best, plan)
    if best is not None and best.portfolio.get("rank") == 0 and answers.MARGIN_SE > 0:
        lines.append("  (the portfolio's first configuration: another trial answers only if its dev beats it by more "
                     f"than {answers.MARGIN_SE:g} standard error(s))")
    if devs:
        again = confirm.seed_for(plan.options.seed)
        lines.append(f"finalists, trained again with seed {again}; the best mean dev among them:")
        lines += [f"  {_trial_text(t, plan, devs)}" for t in answers.ranked(trials) if t.number in devs]
    front = answers.pareto_front(trials) if len(study.directions) > 1 else []
    if front:
        lines.append(f"Pareto front (dev {plan.dev_label} up, stored params % down), {len(front)} trial(s):")
        lines += [f"  {_trial_text(t, plan)}" for t in front]
    baselines = _baseline_lines(trials, plan)
    if baselines:
        lines.append(baseline_cost(trials))
        lines += baselines
    lines += ensemble_lines(ensemble, plan)
    lines.append("next:")
    lines += [f"  {command}" for command in next_commands(plan, answered=best is not None)]
    return lines


def floor_lines(study: optuna.Study, trials: list, best, plan: SearchPlan) -> list[str]:
    """Each split's one-class floor beside the answer; the nothing-learned line when every finished trial's dev
    value is within noise of it (autopelt/study/floors.py)."""
    from autopelt.study.floors import Floors, nothing_learned

    found = Floors.from_dict(study.user_attrs.get("floors"))
    if found is None or found.dev is None or best is None:
        return []
    what = "predicting the mean" if plan.metric in ("pearson", "spearman") else "predicting one class"
    line = f"  one-class floor ({what}): dev {plan.metric} {found.dev:.4f}"
    line += f", test {plan.metric} {found.test:.4f}" if found.test is not None else ""
    devs = [t.values[0] for t in trials if t.state == TrialState.COMPLETE and t.values]
    note = nothing_learned(found, devs, plan.metric)
    return [line, note] if note else [line]


def ensemble_lines(chosen, plan: SearchPlan) -> list[str]:
    """The study's ensemble (`SearchOutcome.ensemble`: autopelt/ensemble/study.py) beside the single answer, and how
    to export it; nothing for an ensemble of fewer than two trials."""
    if chosen is None or len(chosen.members) < 2:
        return []
    hint = (f"  export it: autopelt export --study {shlex.quote(plan.study_name)} --ensemble "
            f"--out {shlex.quote(plan.study_name)}-ensemble") if chosen.answers else None
    return chosen.lines() + ([hint] if hint else [])


def next_commands(plan: SearchPlan, answered: bool = True) -> list[str]:
    """What to run next; `export` only once a trial answers the study (there is nothing to export before)."""
    where = f"--study {shlex.quote(plan.study_name)}"
    if plan.storage != DEFAULT_STORAGE:
        where += f" --storage {shlex.quote(hide_password(plan.storage))}"
    export = [f"autopelt export {where} --out {shlex.quote(plan.study_name)}-best"] if answered else []
    return export + [
        f"autopelt dashboard {where}",
        f"autopelt report {where} --out {shlex.quote(plan.study_name)}.html",
    ]


def baseline_cost(trials: list[TrialRecord]) -> str:
    """What the baselines cost and what the search had: trials, wall time, the learning-rate sweeps' share."""
    base = [t for t in trials if t.baseline and t.seconds]
    final = [t for t in trials if t.confirms and t.seconds]
    searched = [t for t in trials if not t.baseline and not t.confirms and t.seconds]
    base_seconds, searched_seconds = sum(t.seconds for t in base), sum(t.seconds for t in searched)
    final_seconds = sum(t.seconds for t in final)
    total = base_seconds + searched_seconds + final_seconds
    sweeps = sum(float(t.lr_choice.get("seconds") or 0.0) for t in base)
    share = 100 * base_seconds / total if total else 0.0
    chosen = f"; {format_duration(sweeps)} of it choosing learning rates" if sweeps else ""
    text = (f"baselines: {_trials(len(base))}, {format_duration(base_seconds)} ({share:.0f}% of the trial time"
            f"{chosen}) · searched: {_trials(len(searched))}, {format_duration(searched_seconds)}")
    return text + (f" · finalists again: {_trials(len(final))}, {format_duration(final_seconds)}" if final else "")


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
        return f"{base}{first}" + (", then the sampler" if left > 0 else "")
    rest = f", then as many of its next {plan.portfolio_size - 1} as the time allows (early stopping halves " \
        f"them)" if plan.portfolio_size > 1 else ""
    return f"{base}the portfolio's first configuration (to the end){rest}, then the sampler"


def _trials(count: int) -> str:
    return f"{count} trial{'' if count == 1 else 's'}"


def _baseline_lines(trials: list[TrialRecord], plan: SearchPlan) -> list[str]:
    """Each baseline's finished trial; the ones still queued (the budget ran out first) on one line."""
    finished: dict[str, TrialRecord] = {}
    queued: list[str] = []
    late: list[str] = []
    for trial in trials:
        name = trial.baseline
        if name and trial.state.is_finished() and _reason(trial) not in NOT_DONE_REASONS:
            if trial.state in TRAINED or name not in finished or finished[name].state not in TRAINED:
                finished[name] = trial  # the trial that ran it again, not the failure it replaced
        elif name and trial.state == TrialState.WAITING:
            queued.append(name)
        elif name and _reason(trial) == LATE_BASELINE:
            late.append(name)
    width = max((len(name) for name in finished), default=0)
    lines = [f"  {name:<{width}}  {_trial_text(trial, plan)}" for name, trial in finished.items()]
    waiting = [name for name in dict.fromkeys(queued) if name not in finished]
    if waiting:
        lines.append(f"  not run yet (the budget ran out first): {', '.join(waiting)}")
    skipped = [name for name in dict.fromkeys(late) if name not in finished and name not in waiting]
    if skipped:
        lines.append(f"  not run (baselines start in the first half of a wall-time budget; a larger --budget runs "
                     f"them): {', '.join(skipped)}")
    return lines


def _trial_text(trial: TrialRecord, plan: SearchPlan, devs: dict[int, list[float]] | None = None) -> str:
    """`#3 lora r8 (0.33% params, lr 0.003): dev accuracy 0.8525 (mean of 2 seeds: 0.8500, 0.8550), test accuracy
    0.7982 (seed 0)`: every number with its metric's name, the dev value the study ranks it by."""
    head = f"#{trial.number} {_summary(trial)} ({_pct(trial)} params{_rate(trial)})"
    if trial.state == TrialState.COMPLETE:
        test = trial.test_value(plan.metric)
        tail = f", test {plan.metric} {test:.4f}" if test is not None else ""  # a generation task's: bleu
        seeds = (devs or {}).get(trial.number) or (trial.dev_seeds if len(trial.dev_seeds) > 1 else None)
        if seeds:
            each = ", ".join(f"{value:.4f}" for value in seeds)
            tail = f"{tail} (seed {plan.options.seed})" if tail else ""
            return (f"{head}: dev {plan.dev_label} {sum(seeds) / len(seeds):.4f} (mean of {len(seeds)} seeds: "
                    f"{each}){tail}")
        return f"{head}: dev {plan.dev_label} {trial.values[0]:.4f}{tail}"
    return f"{head}: {_outcome(trial)}"


def _rate(trial: TrialRecord) -> str:
    """`, lr 0.003`, and `chosen by a sweep of 3` only where the trial itself swept rates."""
    if not trial.learning_rate:
        return ""
    tried = trial.lr_choice.get("candidates") or {}
    swept = f", chosen by a sweep of {len(tried)}" if trial.lr_choice.get("how") == "sweep" and len(tried) > 1 else ""
    return f", lr {trial.learning_rate:.2g}{swept}"


def _summary(trial: TrialRecord) -> str:
    text = trial.summary or "?"
    if trial.baseline:
        text = f"[{trial.baseline}] {text}"
    elif trial.confirms:
        text = f"[#{trial.confirms.get('trial')} again] {text}"
    return text if len(text) <= SUMMARY_WIDTH else text[: SUMMARY_WIDTH - 1] + "…"


def _pct(trial: TrialRecord) -> str:
    return f"{trial.params_pct:.3g}%" if trial.params_pct is not None else "-"


def _outcome(trial: TrialRecord) -> str:
    if trial.state == TrialState.COMPLETE:
        return f"{trial.values[0]:.4f}"
    if trial.state == TrialState.PRUNED:
        fidelity = trial.fidelity or 0
        top = trial.max_fidelity if trial.max_fidelity is not None else "?"
        last = trial.intermediate.get(fidelity)
        at = f" ({last:.3f})" if last is not None else ""
        why = {FOR_FINALISTS: ", for the finalists", TIME_BUDGET: ", time budget"}.get(trial.stopped_by, "")
        return f"stopped {fidelity}/{top}{at}{why}"
    return f"FAIL: {_reason(trial)}"


def _reason(trial: TrialRecord) -> str:
    return trial.fail_reason or ""
