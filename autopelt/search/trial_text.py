"""One trial in one line, as the live view and the summary write it: its delta, size and rate, and its outcome
with every number's metric named."""

from __future__ import annotations

from optuna.trial import TrialState

from autopelt.search.plan import SearchPlan
from autopelt.study.record import FOR_FINALISTS, TIME_BUDGET, TrialRecord

SUMMARY_WIDTH = 34  # characters of the delta column


def trial_text(trial: TrialRecord, plan: SearchPlan, devs: dict[int, list[float]] | None = None) -> str:
    """`#3 lora r8 (0.33% params, lr 0.003): dev accuracy 0.8525 (mean of 2 seeds: 0.8500, 0.8550), test accuracy
    0.7982 (seed 0)`: every number with its metric's name, the dev value the study ranks it by."""
    head = f"#{trial.number} {delta_text(trial)} ({params_text(trial)} params{rate_text(trial)})"
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
    return f"{head}: {outcome_text(trial)}"


def rate_text(trial: TrialRecord) -> str:
    """`, lr 0.003`, and `chosen by a sweep of 3` only where the trial itself swept rates."""
    if not trial.learning_rate:
        return ""
    tried = trial.lr_choice.get("candidates") or {}
    swept = f", chosen by a sweep of {len(tried)}" if trial.lr_choice.get("how") == "sweep" and len(tried) > 1 else ""
    return f", lr {trial.learning_rate:.2g}{swept}"


def delta_text(trial: TrialRecord) -> str:
    """The delta column: its summary, named as a baseline or as a finalist's re-run, cut to SUMMARY_WIDTH."""
    text = trial.summary or "?"
    if trial.baseline:
        text = f"[{trial.baseline}] {text}"
    elif trial.finalist_of:
        text = f"[#{trial.finalist_of.get('trial')} again] {text}"
    return text if len(text) <= SUMMARY_WIDTH else text[: SUMMARY_WIDTH - 1] + "…"


def params_text(trial: TrialRecord) -> str:
    """Its stored parameters as a share of the base model: `0.33%`, or `-`."""
    return f"{trial.params_pct:.3g}%" if trial.params_pct is not None else "-"


def outcome_text(trial: TrialRecord) -> str:
    """Its dev value, where it stopped and why, or why it failed."""
    if trial.state == TrialState.COMPLETE:
        return f"{trial.values[0]:.4f}"
    if trial.state == TrialState.PRUNED:
        fidelity = trial.fidelity or 0
        top = trial.max_fidelity if trial.max_fidelity is not None else "?"
        last = trial.intermediate.get(fidelity)
        at = f" ({last:.3f})" if last is not None else ""
        why = {FOR_FINALISTS: ", for the finalists", TIME_BUDGET: ", time budget"}.get(trial.stopped_by, "")
        return f"stopped {fidelity}/{top}{at}{why}"
    return f"FAIL: {fail_reason(trial)}"


def fail_reason(trial: TrialRecord) -> str:
    """Why it failed; "" where it did not."""
    return trial.fail_reason or ""
