"""What a search prints at its end: the trials' counts, the answer beside the one-class floor, the finalists, the
Pareto front, the baselines and what they cost, the ensemble, and what to run next. Built from the study's records
(autopelt/study/record.py), so it names the same answer as export and the report (autopelt/study/answers.py)."""

from __future__ import annotations

import shlex

import optuna
from optuna.trial import TrialState

from autopelt.search import finalists
from autopelt.search.budget import format_duration
from autopelt.search.claims import LATE_BASELINE, NOT_DONE_REASONS, TRAINED
from autopelt.search.plan import SearchPlan
from autopelt.search.trial_text import fail_reason, trial_text
from autopelt.study import answers
from autopelt.study.info import floors_of
from autopelt.study.record import TrialRecord, read_all
from autopelt.study.storage import DEFAULT_STORAGE, hide_password


def summary_lines(study: optuna.Study, plan: SearchPlan, seconds: float, rejected: int = 0,
                  ensemble=None) -> list[str]:
    """What a search prints at its end; `ensemble` the study's (SearchOutcome.ensemble), chosen before."""
    trials = read_all(study)
    count = {state: sum(t.state == state for t in trials) for state in TrialState}
    failed = [t for t in trials if t.state == TrialState.FAIL and fail_reason(t) not in NOT_DONE_REASONS
              and not fail_reason(t).startswith("over parameter budget")]
    lines = [
        "",
        f"study {plan.study_name}: {count[TrialState.COMPLETE]} complete, {count[TrialState.PRUNED]} stopped "
        f"early, {len(failed)} failed ({format_duration(seconds)} in this run)",
    ]
    if rejected:
        lines.append(f"{rejected} delta(s) over --max-params {plan.param_limit} were recorded as FAIL, never trained")
    best = answers.best(trials)
    devs = answers.seed_devs(trials)
    lines.append(f"best: {trial_text(best, plan, devs)}" if best else "best: no trial completed yet")
    lines += floor_lines(study, trials, best, plan)
    if best is not None and best.portfolio.get("rank") == 0 and answers.MARGIN_SE > 0:
        lines.append("  (the portfolio's first configuration: another trial answers only if its dev beats it by more "
                     f"than {answers.MARGIN_SE:g} standard error(s))")
    if devs:
        again = finalists.seed_for(plan.options.seed)
        lines.append(f"finalists, trained again with seed {again}; the best mean dev among them:")
        lines += [f"  {trial_text(t, plan, devs)}" for t in answers.ranked(trials) if t.number in devs]
    front = answers.pareto_front(trials) if len(study.directions) > 1 else []
    if front:
        lines.append(f"Pareto front (dev {plan.dev_label} up, stored params % down), {len(front)} trial(s):")
        lines += [f"  {trial_text(t, plan)}" for t in front]
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

    found = Floors.from_dict(floors_of(study))
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
    final = [t for t in trials if t.finalist_of and t.seconds]
    rest = [t for t in trials if not t.baseline and not t.finalist_of and t.seconds]
    members = [t for t in rest if getattr(t, "portfolio", None)]  # a portfolio's members and leaders' variants
    searched = [t for t in rest if not getattr(t, "portfolio", None)]  # drawn by the sampler, refined baselines
    base_seconds, final_seconds = sum(t.seconds for t in base), sum(t.seconds for t in final)
    total = base_seconds + sum(t.seconds for t in rest) + final_seconds
    sweeps = sum(float(t.lr_choice.get("seconds") or 0.0) for t in base)
    share = 100 * base_seconds / total if total else 0.0
    chosen = f"; {format_duration(sweeps)} of it choosing learning rates" if sweeps else ""
    text = f"baselines: {_trials(len(base))}, {format_duration(base_seconds)} ({share:.0f}% of the trial time{chosen})"
    if members:
        text += f" · portfolio: {_part(members)}"
    text += f" · searched: {_part(searched) if searched or not members else 'none'}"
    return text + (f" · finalists again: {_part(final)}" if final else "")


def _part(trials: list[TrialRecord]) -> str:
    return f"{_trials(len(trials))}, {format_duration(sum(t.seconds for t in trials))}"


def _baseline_lines(trials: list[TrialRecord], plan: SearchPlan) -> list[str]:
    """Each baseline's finished trial; the ones still queued (the budget ran out first) on one line."""
    finished: dict[str, TrialRecord] = {}
    queued: list[str] = []
    late: list[str] = []
    for trial in trials:
        name = trial.baseline
        if name and trial.state.is_finished() and fail_reason(trial) not in NOT_DONE_REASONS:
            if trial.state in TRAINED or name not in finished or finished[name].state not in TRAINED:
                finished[name] = trial  # the trial that ran it again, not the failure it replaced
        elif name and trial.state == TrialState.WAITING:
            queued.append(name)
        elif name and fail_reason(trial) == LATE_BASELINE:
            late.append(name)
    width = max((len(name) for name in finished), default=0)
    lines = [f"  {name:<{width}}  {trial_text(trial, plan)}" for name, trial in finished.items()]
    waiting = [name for name in dict.fromkeys(queued) if name not in finished]
    if waiting:
        lines.append(f"  not run yet (the budget ran out first): {', '.join(waiting)}")
    skipped = [name for name in dict.fromkeys(late) if name not in finished and name not in waiting]
    if skipped:
        lines.append(f"  not run (baselines start in the first half of a wall-time budget; a larger --budget runs "
                     f"them): {', '.join(skipped)}")
    return lines


def _trials(count: int) -> str:
    return f"{count} trial{'' if count == 1 else 's'}"
