"""After the baselines: the best two of them again, first at half their batch size (and with mean pooling, if they
read the first token), then in more places, then at twice the rate each chose.

(Since 0a06568 the baselines of a study on a sentence-transformers checkpoint, the default model included, read it by
the mean already (models.own_pooling), so there the first refinement halves the batch alone. The measurements below
were made before, with baselines that read the first token.)

At this budget the learning rate decides more than the method (README): on SST-2 UniPELT(APL) gave 77.3 at 5e-4
and 82.8 at 2e-3, and LoRA on SNLI learns only from about 3.7e-3 up to 6.6e-3. A baseline's rate comes from a
sweep that compares candidates half a decade apart after one epoch, so the best deltas the study knows may sit
one step off their best rate or their best shape. Measured on the benchmark's rows (K=1000, 3 epochs, seeds 1-5,
paired against tuned LoRA's re-runs, bench/deltas_by_hand.py):

- in more places: LoRA r8 on query, value and the feed-forward block's two projections (intermediate and output;
  QLoRA's finding that LoRA needs the FFN, He et al.'s that FFN changes use capacity best) at the rate / sqrt 2 (the
  rate the sweep chose sits near the edge of stability; 2.1e-3, on SST-2 2e-3), read by the mean, against the LoRA
  paper's every attention projection at the same rate (634caef, 5 seeds on the benchmark's rows, seed 0 / seed
  10): SST-2 81.7 / 80.8 against 79.7 / 79.8, SNLI 66.5 / 67.4 against 64.0 / 65.1, and +2.0 / +2.0 paired
  against the SNLI picks (LoRA read by the mean at 1.5x its rate, at batch 16), where dev sees it too (67.5 / 67.7
  against 65.5 / 64.4). So the FFN goes first, and all of attention only where the space cannot say the FFN
  (VeRA's targets in the default space). In the search-value runs at c6ac88f it answered on SNLI seed 0 (66.5,
  +3.7 over the best baseline) and lost the SST-2 finalists by one dev row at both draws (README). A Pfeiffer
  adapter goes in Houlsby's place too (after attention as well as after the FFN): on SST-2 the adapter baseline's
  delta so, at its rate / sqrt 2 (2.1e-3), tests 79.4, +1.2 +- 0.9 paired against the baseline (78.2).
- at half the batch size: with 1,000 rows a 3-epoch run takes 96 steps of 32. LoRA r8 at batch 16 (2e-3) tests
  80.7 on SST-2 (+1.4 +- 0.9), 60.9 on SNLI (-0.4 +- 2.6). The rate times 1/sqrt(2): the square-root rule for
  Adam.
- with mean pooling (the head reads the mean of the last layer's token states, the way sentence-transformers
  checkpoints such as all-MiniLM-L6-v2 were trained, not BERT's pooler over the first token), at the rate the
  baseline chose: LoRA r8 (q,v) tests 63.2 on SNLI at 5.5e-3 (+1.4 +- 3.5 paired against the same LoRA with the
  model's pooling, 61.8) and 62.8 at 3e-3 (std 1.5 against 3.8); 81.0 on SST-2 at 4.4e-3 (+1.0 +- 0.6 against
  80.0). The one change that gained on both tasks.
- with mean pooling and at half the batch size together (the rate / sqrt 2): better than mean pooling alone in all
  four cases measured, so each baseline's first refinement makes both changes. 5-seed test, paired (the benchmark's
  study rows at --seed 0, re-runs with seeds 1-5; at --seed 10, 11-15):
  - SST-2 seed 10, LoRA r8 (2.1e-3 at 16): 81.1 +- 1.4, +1.3 +- 1.3 against mean pooling alone (79.8), +2.1 +- 1.8
    against tuned LoRA (79.0), +2.9 against the LoRA baseline;
  - SNLI seed 10, LoRA r8 (3.9e-3 at 16): 66.4 +- 0.6, +1.0 +- 1.8 against mean pooling alone (65.3), +6.6 +- 1.7
    against tuned LoRA (59.8);
  - SST-2 seed 0, UniPELT(APL) (7.1e-4 at 16): 81.6 +- 0.7, +0.6 +- 0.4 against mean pooling alone (81.0), +1.5 +- 0.9
    against tuned LoRA (80.1); LoRA r8 so: 81.3 +- 0.8, +1.2 +- 0.7 against tuned LoRA;
  - SNLI seed 0, LoRA r8: 65.4 +- 2.2, +2.2 +- 4.6 against mean pooling alone (63.3), +4.5 +- 5.3 against tuned
    LoRA (60.9).
  At 16 a trial takes 192 steps instead of 96: LoRA 5-15% longer, UniPELT(APL) about a third (45 s against 33 in
  the SST-2 study at 44f62ee, where it then missed the finalists' room; README).
- at 2x the rate: never better over five seeds (the adapter at 1.5x on SST-2 78.4 against its baseline's 78.2;
  UniPELT at 2e-3 73.5, one seed at the majority class), so it comes last and on a tight budget never runs.
  0.5x, tried before, never beat its baseline (0 of 4 on SST-2 and SNLI).

Drawn through the space like any other delta, so the sampler learns from them. Early stopping never ends them:
on SST-2 it stopped UniPELT(APL) at 2x (2e-3) after epoch 1 (dev 0.750 against the baseline's 0.789 there),
and its first rung ranks rates poorly.

They are queued once per study, when every baseline has finished or, sooner, when a worker comes free after every
baseline has begun and BEST of them have finished: the best two that have finished then are refined, each only if
no running baseline is still measuring the rate of one of its families (a refinement's rate is its families' rate
times a scale; a rate measured after it was queued would move it). On SST-2 at 20 warm equivalents (8cb617c plus
the one-round room) the worker freed while the Compacter baseline ran drew a searched delta (0.806 on dev), after
which the budget held only the finalists; UniPELT(APL) with mean pooling, the first refinement, had given 0.849 and
been the answer (81.0 on test against the baseline's 78.4) in the run with the larger budget before. Queued so,
they are the best two finished then, not the best two of all. Refinements go only where the space can say them: it
draws the baselines' presets (they were queued with its parameters) and its learning rate is `auto` with an
`lr_scale` (a searched delta trains at its families' baseline rates times `lr_scale`, `learning_rates.py`); the
smaller batch only where the space draws `batch_size` with that value, more places only where it draws LoRA's or
VeRA's targets with all of attention or the adapter's placement, mean pooling only where it draws `pooling`.

On a wall-time budget a refinement starts only if it can end before the finalists' room at its own expected time
(`expected_seconds`: its baseline's training, 1.4x at half the batch), and one that cannot gives way to the next
queued one that can (`Controller._ends_before_room`): on SST-2 at 44f62ee UniPELT(APL) at half the batch began 36 s
before the room, took 45 s and was stopped, where LoRA at half the batch takes about 25.
"""

from __future__ import annotations

from typing import Iterable

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from autopelt.search import confirm, learning_rates
from autopelt.search.claims import covers
from autopelt.study import answers, record
from autopelt.study.record import TrialRecord

BEST = 2  # baselines refined
FACTOR = 2.0  # times the rate each chose; the sweep's candidates are ~3.2x apart
BATCH = "batch_size"
SCALE = "lr_scale"
FFN = ("intermediate", "output")  # the feed-forward block's two projections
ATTENTION = ("query", "key", "value", "attention_output")  # every projection of self-attention
PLACEMENT = "adapter.placement"
WIDER = 0.5 ** 0.5  # times the rate, in twice the places: the rate each chose sits near the edge of stability
POOLING, MEAN = "pooling", "mean"
HALF_BATCH_SLOWER = 1.4  # training time at half the batch (twice the steps): on SST-2 at 44f62ee a LoRA r8 trial took
#                          25 s against 21, UniPELT(APL) 45 against 33, about 1.25x and 1.4x of their training alone
MORE_PLACES_SLOWER = 1.15  # training time with LoRA on the FFN too (or twice the adapters): at c6ac88f LoRA r8 so
#                            took 16-17 s against 14 on SST-2, 24-28 against 22-24 on SNLI


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
    return {learning_rates.BASELINE_FAMILIES[name] for t in trials if t.state == TrialState.RUNNING
            and (name := record.baseline_of(t)) in learning_rates.BASELINE_FAMILIES}


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
    rates = learning_rates.measured(records)
    drawn = [r for r in records if r.baseline and r.baseline_drawn and r.learning_rate
             and isinstance(r.distributions.get(SCALE), FloatDistribution)]
    leading, first, last = [], [], []
    for base in answers.ranked(drawn, maximize)[:BEST]:  # the study's one rule for "best"
        reference, _ = learning_rates.reference_rate(base.spec, rates)
        if reference is None or skip & set(learning_rates.families(base.spec)):
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
    them; a Pfeiffer adapter also after attention, Houlsby's placement."""
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
        elif name == PLACEMENT and value == "pfeiffer" and "houlsby" in choices.choices:
            out[name] = "houlsby"
    return out


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
             if (seconds := confirm.seconds_of(r)) is not None and r.train_seconds is not None
             and r.eval_seconds is not None]
    return max(0.0, min(spent, default=0.0))


def enqueue(study: optuna.Study, trials: list[FrozenTrial], limit: int | None = None) -> int:
    """Queue the refinements of `trials`' baselines, at most `limit`; how many."""
    queue = refinements((record.read(t) for t in trials), answers.maximizes(study), unsettled(trials))[:limit]
    for item in queue:
        study.enqueue_trial(item["params"], user_attrs=record.attrs(refines=item["refines"]))
    return len(queue)
