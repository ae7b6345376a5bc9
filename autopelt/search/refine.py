"""After the baselines: the best two of them again, at twice the rate each chose, and at half its batch size.

At this budget the learning rate decides more than the method (README): on SST-2 UniPELT(APL) gave 77.3 at 5e-4
and 82.8 at 2e-3, and LoRA on SNLI learns only from about 3.7e-3 up to 6.6e-3. A baseline's rate comes from a
sweep that compares candidates half a decade apart after one epoch, so the best deltas the study knows may sit
one step off their best rate. And with 1,000 rows a 3-epoch run takes 96 steps of 32: on SST-2 LoRA r8 at
batch 16 (2e-3) tests 80.6 over seeds 1-5, at batch 32 (tuned, 2.1e-3) 79.3. So the first searched trials are the
best baselines' own deltas (by dev metric) at 2x their rate, and at half their batch size with the rate times
1/sqrt(2) (the square-root rule for Adam), drawn through the space like any other delta, so the sampler learns
from them. 0.5x, tried before, never beat its baseline (0 of 4 on SST-2 and SNLI).

Early stopping never ends them: on SST-2 it stopped UniPELT(APL) at 2x (2e-3) after epoch 1 (dev 0.750 against
the baseline's 0.789 there), and UniPELT at 2e-3 trained to the end tests 80.4 over seeds 1-5 against 78.0 at
the 1e-3 its sweep chose. There are at most four of them, so they cost at most four full trials.

They are queued once per study, when every baseline has finished, and only where the space can say them: it
draws the baselines' presets (they were queued with its parameters) and its learning rate is `auto` with an
`lr_scale` (a searched delta trains at its families' baseline rates times `lr_scale`, `learning_rates.py`); the
smaller batch only where the space draws `batch_size` with that value.
"""

from __future__ import annotations

from typing import Iterable

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from autopelt.search import learning_rates
from autopelt.search.claims import covers
from autopelt.study import answers, record
from autopelt.study.record import TrialRecord

BEST = 2  # baselines refined
FACTOR = 2.0  # times the rate each chose; the sweep's candidates are ~3.2x apart
BATCH = "batch_size"
SCALE = "lr_scale"


def queued(trials: list[FrozenTrial]) -> bool:
    """A refinement was queued in this study (by this process or another, now or in an earlier run)."""
    return any(record.read(t).refines for t in trials)


def due(trials: list[FrozenTrial], baselines: list[str]) -> bool:
    """Every baseline of the study has finished."""
    finished = {record.baseline_of(t) for t in trials
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) and covers(t)}
    return set(baselines) <= finished


def refinements(records: Iterable[TrialRecord], maximize: bool = True) -> list[dict]:
    """[{"params", "refines"}] to queue: the best BEST drawn baselines that answer the study, each at FACTOR times
    its rate and at half its batch size (rate / sqrt 2), best baseline first."""
    records = list(records)
    rates = learning_rates.measured(records)
    drawn = [r for r in records if r.baseline and r.baseline_drawn and r.learning_rate
             and isinstance(r.distributions.get(SCALE), FloatDistribution)]
    queue = []
    for base in answers.ranked(drawn, maximize)[:BEST]:  # the study's one rule for "best"
        reference, _ = learning_rates.reference_rate(base.spec, rates)
        if reference is None:
            continue
        queue.append(_again(base, reference, FACTOR))
        half = _half_batch(base)
        if half is not None:  # the square-root rule
            queue.append(_again(base, reference, (half / base.params[BATCH]) ** 0.5, **{BATCH: half}))
    return queue


def _again(base: TrialRecord, reference: float, factor: float, **params) -> dict:
    """The baseline's delta at `factor` times its rate, within the space's lr_scale range around its families'
    `reference` rate: the factor recorded is the one the trial gets."""
    bounds = base.distributions[SCALE]
    scale = min(max(factor * base.learning_rate / reference, bounds.low), bounds.high)
    return {"params": {**base.params, **params, SCALE: scale},
            "refines": {"baseline": base.baseline, **params,
                        "factor": float(f"{scale * reference / base.learning_rate:.2g}")}}


def _half_batch(base: TrialRecord) -> int | None:
    """Half the batch size the baseline trained with, where the space draws it; else None."""
    batch, choices = base.params.get(BATCH), base.distributions.get(BATCH)
    if not isinstance(choices, CategoricalDistribution) or not isinstance(batch, int) or batch < 2:
        return None
    return batch // 2 if batch // 2 in choices.choices else None


def enqueue(study: optuna.Study, trials: list[FrozenTrial], limit: int | None = None) -> int:
    """Queue the refinements of `trials`' baselines, at most `limit`; how many."""
    queue = refinements((record.read(t) for t in trials), answers.maximizes(study))[:limit]
    for item in queue:
        study.enqueue_trial(item["params"], user_attrs=record.attrs(refines=item["refines"]))
    return len(queue)
