"""After the baselines: the best two of them again, reshaped. Used only without a portfolio
(`--portfolio none`): a portfolio already holds such reshaped configurations, chosen from data.

The refinements, in order, each a trial of its own:
1. at half the batch size, at the rate / sqrt 2 (the square-root rule for Adam), and with mean pooling where the
   baseline read the first token;
2. in more places: LoRA (and VeRA) grown to the feed-forward block's two projections (intermediate, output), or to
   every attention projection where the space cannot say the FFN; a field its registry entry widens (`wider`: a
   Pfeiffer adapter in Houlsby's places too); at the rate / sqrt 2;
3. at FACTOR times the rate the baseline chose.

Whether each earns its place is measured on the tasks the rules were not chosen on: lab/experiments/portfolio-rules,
docs/portfolio.md ("Rules judged again").

Refinements are drawn through the space like any other delta, so the sampler learns from them; early stopping never
ends them (a first epoch ranks rates poorly). They are queued once per study, when every baseline has finished or,
sooner, when a worker comes free after every baseline has begun and BEST of them have finished; each only if no
running baseline still measures the rate of one of its families (a refinement's rate is its families' rate times a
scale: rule 4 of rate_policy.py). They go only where the space can say them: it draws the baselines' presets, its
learning rate is `auto` with an `lr_scale`, and it draws the batch size, targets, placement or pooling the
refinement changes.

On a wall-time budget a refinement starts only if it can end before the finalists' room at its own expected time
(`expected_seconds`), else the next queued one that can (`Controller._ends_before_room`).
"""

from __future__ import annotations

from typing import Iterable

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from autopelt.delta import registry
from autopelt.search import finalists, rate_policy
from autopelt.search.claims import covers
from autopelt.study import answers, record
from autopelt.study.record import TrialRecord

BEST = 2  # baselines refined
FACTOR = 2.0  # times the rate each chose; the sweep's candidates are ~3.2x apart
BATCH = "batch_size"
SCALE = "lr_scale"
FFN = ("intermediate", "output")  # the feed-forward block's two projections
ATTENTION = ("query", "key", "value", "attention_output")  # every projection of self-attention
WIDER = 0.5 ** 0.5  # times the rate, in twice the places: the rate each chose sits near the edge of stability
POOLING, MEAN = "pooling", "mean"
HALF_BATCH_SLOWER = 1.4  # training time at half the batch (twice the steps); measured in docs/search.md
MORE_PLACES_SLOWER = 1.15  # training time with LoRA on the FFN too (or twice the adapters); docs/search.md


def ready(trials: list[FrozenTrial], baselines: list[str]) -> bool:
    """The refinements may be queued: every baseline has finished, or every one has begun and BEST have finished
    (the controller asks when a worker is free)."""
    finished = set(baselines) & _finished(trials)
    if finished == set(baselines):
        return True
    begun = {record.baseline_of(t) for t in trials if t.state != TrialState.WAITING and covers(t)}
    return set(baselines) <= begun and len(finished) >= BEST


def unsettled(trials: list[FrozenTrial]) -> set[str]:
    """The families whose measured rate may still change: those of the baselines still running."""
    return {family for t in trials if t.state == TrialState.RUNNING
            and (family := rate_policy.baseline_family(record.baseline_of(t)))}


def queued(trials: list[FrozenTrial]) -> bool:
    """A refinement was queued in this study (by this process or another, now or in an earlier run)."""
    return any(record.read(t).refines for t in trials)


def due(trials: list[FrozenTrial], baselines: list[str]) -> bool:
    """Every baseline of the study has finished."""
    return set(baselines) <= _finished(trials)


def _finished(trials: list[FrozenTrial]) -> set[str]:
    return {record.baseline_of(t) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) and covers(t)}


def refinements(records: Iterable[TrialRecord], maximize: bool = True, skip: set[str] = frozenset()) -> list[dict]:
    """[{"params", "refines"}] to queue: the best BEST drawn baselines that answer the study, each with mean pooling
    and at half its batch size (at its rate / sqrt 2), or with the one of the two the space can say; then each in
    more places (at its rate / sqrt 2), best baseline first; then each at FACTOR times its rate. A baseline with a
    family in `skip` is left out."""
    records = list(records)
    rates = rate_policy.measured(records)
    drawn = [r for r in records if r.baseline and r.baseline_drawn and r.learning_rate
             and isinstance(r.distributions.get(SCALE), FloatDistribution)]
    leading, first, last = [], [], []
    for base in answers.ranked(drawn, maximize)[:BEST]:  # the study's one rule for "best"
        reference, _ = rate_policy.reference_rate(base.spec, rates)
        if reference is None or skip & set(rate_policy.families(base.spec)):
            continue
        pooling, half = (MEAN if _can_pool_mean(base) else None), _half_batch(base)
        if pooling or half is not None:  # both where the space says both; half the batch by the square-root rule
            factor = 1.0 if half is None else (half / base.params[BATCH]) ** 0.5
            leading.append(_again(base, reference, factor, batch=half, pooling=pooling))
        places = _in_more_places(base)
        if places:
            first.append(_again(base, reference, WIDER, places=places))
        last.append(_again(base, reference, FACTOR))
    return leading + first + last


def _again(base: TrialRecord, reference: float, factor: float, batch: int | None = None,
           places: dict | None = None, pooling: str | None = None) -> dict:
    """The baseline's delta at `factor` times its rate, within the space's lr_scale range around its families'
    `reference` rate (the factor recorded is the one the trial gets), at another batch size or in more places
    (the space's parameters that say them)."""
    bounds = base.distributions[SCALE]
    scale = min(max(factor * base.learning_rate / reference, bounds.low), bounds.high)
    refines = {"baseline": base.baseline, "factor": float(f"{scale * reference / base.learning_rate:.2g}")}
    params = {**base.params, **(places or {}), SCALE: scale}
    if batch is not None:
        params[BATCH] = refines[BATCH] = batch
    if places:
        refines["places"] = places
    if pooling is not None:
        params[POOLING] = refines[POOLING] = pooling
    return {"params": params, "refines": refines}


def _can_pool_mean(base: TrialRecord) -> bool:
    """The space draws the head's pooling, mean among its choices, and the baseline read the first token."""
    choices = base.distributions.get(POOLING)
    return isinstance(choices, CategoricalDistribution) and MEAN in choices.choices and base.params.get(POOLING) != MEAN


def _in_more_places(base: TrialRecord) -> dict:
    """The space's parameters that put the baseline's methods in more places, {} if it has none: LoRA's (and
    VeRA's) targets grown to the feed-forward block's two projections as well, or where the space cannot say that,
    to every attention projection (the LoRA paper's placement), each the fewest targets the space draws that hold
    them; a method's field its registry entry widens (`Method.wider`: a Pfeiffer adapter also after attention,
    Houlsby's placement), where the space draws the wider value."""
    out = {}
    for name, value in base.params.items():
        choices = base.distributions.get(name)
        if not isinstance(choices, CategoricalDistribution) or not isinstance(value, str):
            continue
        if name.endswith(".targets"):
            have = set(value.split("+"))
            drawn = {c: set(c.split("+")) for c in choices.choices if isinstance(c, str)}
            for grown in (FFN, ATTENTION):  # the fewest targets the space draws that hold the baseline's and those
                wider = [c for c, targets in drawn.items() if targets >= have | set(grown) and targets != have]
                if wider:
                    out[name] = min(wider, key=lambda c: len(drawn[c]))
                    break
        elif (wide := _wider(name, value)) is not None and wide in choices.choices:
            out[name] = wide
    return out


def _wider(name: str, value: str):
    """The wider value of a space's parameter `method.field` (its method's entry's `wider`), or None; a mixture's
    own delta (`adamix.adapter.placement`) is not widened."""
    method, _, field = name.partition(".")
    return registry.wider(method, field, value)


def _half_batch(base: TrialRecord) -> int | None:
    """Half the batch size the baseline trained with, where the space draws it; else None."""
    batch, choices = base.params.get(BATCH), base.distributions.get(BATCH)
    if not isinstance(choices, CategoricalDistribution) or not isinstance(batch, int) or batch < 2:
        return None
    return batch // 2 if batch // 2 in choices.choices else None


def expected_seconds(refines: dict, records: list[TrialRecord]) -> float | None:
    """How long a queued refinement (its `refines`) should take: its baseline's own training (its rate sweep's
    losing candidates left out) at the refinement's batch size and places, the baseline's evaluations, and the
    least overhead any trial of the study had (a warm worker's: a worker's first trial also starts up); None while
    its baseline has not measured that."""
    base = next((r for r in records if r.baseline == refines.get("baseline") and r.is_answer
                 and r.train_seconds is not None), None)
    if base is None:
        return None
    train = base.train_seconds * (HALF_BATCH_SLOWER if BATCH in refines else 1.0) \
        * (MORE_PLACES_SLOWER if refines.get("places") else 1.0)
    return train + (base.eval_seconds or 0.0) + _warm_overhead(records)


def _warm_overhead(records: list[TrialRecord]) -> float:
    """The least wall time a trial of the study spent outside training and evaluating (0 when none says)."""
    spent = [seconds - r.train_seconds - r.eval_seconds for r in records
             if (seconds := finalists.seconds_of(r)) is not None and r.train_seconds is not None
             and r.eval_seconds is not None]
    return max(0.0, min(spent, default=0.0))


def enqueue(study: optuna.Study, trials: list[FrozenTrial], limit: int | None = None) -> int:
    """Queue the refinements of `trials`' baselines, at most `limit`; how many."""
    queue = refinements((record.read(t) for t in trials), answers.maximizes(study), unsettled(trials))[:limit]
    for item in queue:
        study.enqueue_trial(item["params"], user_attrs=record.attrs(refines=item["refines"]))
    return len(queue)
